"""Grouped LoRA ops against a straightforward per-token reference, on random inputs."""

from __future__ import annotations

import pytest
import torch
from vllm.lora.punica_wrapper import punica_cpu

from engine import lora_kernels
from engine.lora_kernels import (
    TokenGroup,
    grouped_expand,
    grouped_shrink,
    make_grouped_wrapper,
    plan_batch,
    token_groups,
)


def _rows(group: TokenGroup) -> list[int]:
    if isinstance(group.rows, slice):
        return list(range(group.rows.start, group.rows.stop))
    return group.rows.tolist()


@pytest.mark.parametrize("indices,expected", [
    ([], []),
    ([-1, -1, -1], []),
    ([2], [(2, [0], True)]),
    ([1, 1, 1, 1], [(1, [0, 1, 2, 3], True)]),
    ([0, 0, -1, 1, 1], [(0, [0, 1], True), (1, [3, 4], True)]),
    ([0, 1, 0, -1, 1], [(0, [0, 2], False), (1, [1, 4], False)]),
    ([-1, 3, 3, -1], [(3, [1, 2], True)]),
])
def test_token_groups(indices, expected):
    groups = token_groups(torch.tensor(indices, dtype=torch.long))
    got = [(g.slot, _rows(g), isinstance(g.rows, slice)) for g in groups]
    assert got == expected


@pytest.mark.parametrize("indices,padded,slots,max_len", [
    ([0, 0, 1, 1], False, None, None),
    ([0, 1, 0, 1], True, slice(0, 2), 2),
    ([2, -1, 0, 2, 2], True, torch.tensor([0, 2]), 3),
    ([-1, -1], False, None, None),
])
def test_plan_batch(indices, padded, slots, max_len):
    plan = plan_batch(torch.tensor(indices))
    assert plan.contiguous == (not padded)
    if padded:
        p = plan.padded
        assert p.max_len == max_len and p.num_groups == len(plan.groups)
        if isinstance(slots, slice):
            assert p.slots == slots
        else:
            assert torch.equal(p.slots, slots)
        assert sorted(p.rows.tolist()) == [t for t, s in enumerate(indices) if s >= 0]
        assert torch.equal(p.pad_rows[p.valid], p.rows)


def _reference_lora(x, lora_a, lora_b, indices, scale):
    """y_t = scale * B[s_t] @ (A[s_t] @ x_t) for tokens with an adapter, 0 otherwise."""
    out = torch.zeros(x.shape[0], lora_b.shape[2])
    for t, slot in enumerate(indices.tolist()):
        if slot >= 0:
            out[t] = lora_b[slot, 0] @ (lora_a[slot, 0] @ x[t]) * scale
    return out


CASES = {
    "mixed and interleaved": [0, 1, -1, 2, 0, 1, 1, -1],
    "single token": [1],
    "single base token": [-1],
    "every token on one adapter": [2, 2, 2, 2, 2],
    "no adapter at all": [-1, -1, -1, -1],
    "empty segments (slot 1 unused)": [0, 0, 2, 2],
    "contiguous segments": [0, 0, 0, 1, 1, -1, -1, 2],
}


@pytest.mark.parametrize("rank", [8, 16, 64])
@pytest.mark.parametrize("name", list(CASES))
def test_shrink_then_expand_matches_reference(name, rank):
    g = torch.Generator().manual_seed(rank)
    indices = torch.tensor(CASES[name])
    tokens, hidden, out_dim, slots = len(indices), 48, 40, 3
    x = torch.randn(tokens, hidden, generator=g)
    lora_a = torch.randn(slots, 1, rank, hidden, generator=g)
    lora_b = torch.randn(slots, 1, out_dim, rank, generator=g)
    groups = plan_batch(indices)

    buffer = torch.zeros(tokens, rank)
    grouped_shrink(buffer, x, lora_a, groups, 0.5)
    y = torch.randn(tokens, out_dim + 8, generator=g)
    before = y.clone()
    grouped_expand(y, buffer, lora_b, groups, 4, out_dim, add_inputs=True)

    expected = before.clone()
    expected[:, 4:4 + out_dim] += _reference_lora(x, lora_a, lora_b, indices, 0.5)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    base_rows = (indices < 0).nonzero().squeeze(1)
    assert torch.equal(y[base_rows], before[base_rows]), "base tokens must be bit-for-bit untouched"


@pytest.mark.parametrize("indices", [[1, -1, 0, 1], [0, 0, -1, 1]], ids=["scattered", "contiguous"])
def test_expand_without_add_inputs_overwrites_only_adapter_rows(indices):
    indices = torch.tensor(indices)
    x, lora_b = torch.randn(4, 8), torch.randn(2, 1, 6, 8)
    y = torch.full((4, 6), 3.0)
    grouped_expand(y, x, lora_b, plan_batch(indices), 0, 6, add_inputs=False)
    for t, slot in enumerate(indices.tolist()):
        expected = lora_b[slot, 0] @ x[t] if slot >= 0 else torch.full((6,), 3.0)
        torch.testing.assert_close(y[t], expected)


def _wrapper_with(indices: torch.Tensor):
    cls = make_grouped_wrapper(punica_cpu.PunicaWrapperCPU)
    wrapper = object.__new__(cls)
    wrapper._plan, wrapper._num_tokens = plan_batch(indices), indices.numel()
    return wrapper


def test_wrapper_add_lora_linear_matches_reference_for_merged_slices():
    """q/k/v as three slices of one merged output, as vLLM's QKV LoRA layer calls it."""
    g = torch.Generator().manual_seed(7)
    indices = torch.tensor([0, -1, 1, 1, 0])
    x = torch.randn(5, 32, generator=g)
    slices = (16, 8, 8)
    lora_a = tuple(torch.randn(2, 1, 4, 32, generator=g) for _ in slices)
    lora_b = tuple(torch.randn(2, 1, n, 4, generator=g) for n in slices)
    y = torch.randn(5, sum(slices), generator=g)
    expected = y.clone()
    offset = 0
    for a, b, n in zip(lora_a, lora_b, slices):
        expected[:, offset:offset + n] += _reference_lora(x, a, b, indices, 1.0)
        offset += n
    _wrapper_with(indices).add_lora_linear(y, x, lora_a, lora_b, 1.0, slices)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)


def test_wrapper_refuses_mismatched_rows():
    wrapper = _wrapper_with(torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="LORAPLEX_LORA_KERNELS=stock"):
        wrapper.add_shrink(torch.zeros(1, 3, 4), torch.randn(3, 8), (torch.randn(2, 1, 4, 8),), 1.0)


def test_unverified_vllm_version_fails_loudly(monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    monkeypatch.delenv(lora_kernels.ENV_SWITCH, raising=False)
    with pytest.raises(RuntimeError, match="verified for vLLM"):
        lora_kernels.install()


def test_stock_switch_installs_nothing(monkeypatch):
    monkeypatch.setenv(lora_kernels.ENV_SWITCH, "stock")
    assert lora_kernels.install() is False
    monkeypatch.setenv(lora_kernels.ENV_SWITCH, "fast")
    with pytest.raises(ValueError):
        lora_kernels.install()


def test_wrapper_add_lora_logits_groups_by_sequence_and_handles_padding():
    g = torch.Generator().manual_seed(3)
    sampler = torch.tensor([1, -1, 0])
    wrapper = _wrapper_with(torch.tensor([1, 1, -1, 0]))
    wrapper._sampler_plan = plan_batch(sampler)
    x = torch.randn(3, 16, generator=g)
    lora_a = torch.randn(2, 1, 4, 16, generator=g)
    lora_b = torch.randn(2, 1, 24, 4, generator=g)  # 24 rows: vocabulary padded past the 20 logits
    y = torch.randn(3, 20, generator=g)
    expected = y + _reference_lora(x, lora_a, lora_b, sampler, 0.5)[:, :20]
    wrapper.add_lora_logits(y, x, lora_a, lora_b, 0.5)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)


def test_wrapper_add_lora_logits_without_adapters_does_nothing():
    wrapper = _wrapper_with(torch.tensor([-1, -1]))
    wrapper._sampler_plan = plan_batch(torch.tensor([-1, -1]))
    y = torch.randn(2, 8)
    before = y.clone()
    wrapper.add_lora_logits(y, torch.randn(2, 4), torch.randn(1, 1, 2, 4), torch.randn(1, 1, 8, 2), 1.0)
    assert torch.equal(y, before)


def test_wrapper_add_lora_linear_without_adapters_leaves_output_alone():
    wrapper = _wrapper_with(torch.tensor([-1, -1, -1]))
    y = torch.randn(3, 8)
    before = y.clone()
    wrapper.add_lora_linear(y, torch.randn(3, 4), (torch.randn(1, 1, 2, 4),), (torch.randn(1, 1, 8, 2),), 1.0, (8,))
    assert torch.equal(y, before)
