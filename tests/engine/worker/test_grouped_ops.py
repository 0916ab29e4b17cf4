"""Grouped LoRA ops against a straightforward per-token reference, on random inputs."""

from __future__ import annotations

import pytest
import torch

from engine.worker.batch_plan import plan_batch
from engine.worker.grouped_ops import grouped_expand, grouped_shrink
from tests.engine.worker.reference import reference_lora

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
    expected[:, 4:4 + out_dim] += reference_lora(x, lora_a, lora_b, indices, 0.5)
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
