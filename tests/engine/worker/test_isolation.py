"""Op-level regression for vllm#48421: a token with slot index -1 must get no adapter contribution."""

from __future__ import annotations

import pytest
import torch
from vllm.lora.ops.torch_ops import lora_ops

from engine.worker import isolation

STOCK_SHRINK = getattr(lora_ops.bgmv_shrink, "__wrapped__", lora_ops.bgmv_shrink)
STOCK_EXPAND = getattr(lora_ops.bgmv_expand, "__wrapped__", lora_ops.bgmv_expand)
STOCK_EXPAND_SLICE = getattr(lora_ops.bgmv_expand_slice, "__wrapped__", lora_ops.bgmv_expand_slice)


def _reference_shrink(x, w, idx, scale):
    out = torch.zeros(x.shape[0], w.shape[2])
    for t, i in enumerate(idx.tolist()):
        if i >= 0:
            out[t] = scale * (w[i, 0] @ x[t])
    return out


def _weights(slots, out_dim, in_dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(slots, 1, out_dim, in_dim, generator=g)


def test_installed_vllm_has_the_defect_that_we_patch():
    """If this fails, vLLM fixed index -1 upstream: the patch is skipped and this test should go."""
    assert isolation.has_index_minus_one_defect(STOCK_SHRINK)


def test_stock_shrink_leaks_into_base_tokens():
    x, w, idx = torch.ones(2, 4), _weights(3, 2, 4), torch.tensor([-1, 1])
    out = torch.zeros(2, 2)
    STOCK_SHRINK(x, w, out, idx, 1.0)
    assert out[0].abs().sum() > 0  # the defect: token 0 got slot 2's adapter


@pytest.mark.parametrize("idx", [[-1, 0, 1, -1], [-1, -1], [2, 2, 2], [1], [-1]])
def test_isolated_shrink_matches_reference(idx):
    idx = torch.tensor(idx)
    x, w = torch.randn(len(idx), 8), _weights(3, 4, 8)
    out = torch.full((len(idx), 4), 7.0)
    isolation.isolate_shrink(STOCK_SHRINK)(x, w, out, idx, 0.5)
    torch.testing.assert_close(out, _reference_shrink(x, w, idx, 0.5))


@pytest.mark.parametrize("add_inputs", [True, False])
@pytest.mark.parametrize("idx", [[-1, 0, 1, -1], [-1, -1], [0, 1, 2]])
def test_isolated_expand_leaves_base_rows_untouched(idx, add_inputs):
    idx = torch.tensor(idx)
    x, w = torch.randn(len(idx), 4), _weights(3, 6, 4, seed=1)
    out = torch.randn(len(idx), 6)
    before = out.clone()
    isolation.isolate_expand(STOCK_EXPAND)(x, w, out, idx, add_inputs)
    for t, i in enumerate(idx.tolist()):
        if i < 0:
            torch.testing.assert_close(out[t], before[t])
        else:
            expected = w[i, 0] @ x[t] + (before[t] if add_inputs else 0)
            torch.testing.assert_close(out[t], expected)


def test_isolated_expand_slice_only_touches_adapter_rows():
    idx = torch.tensor([1, -1])
    x, w = torch.randn(2, 4), _weights(2, 3, 4, seed=2)
    out = torch.zeros(2, 10)
    isolation.isolate_expand(STOCK_EXPAND_SLICE)(x, w, out, idx, 2, 3, True)
    torch.testing.assert_close(out[1], torch.zeros(10))
    torch.testing.assert_close(out[0, 2:5], w[1, 0] @ x[0])
