"""Fused per-module LoRA ops: padded ranks, slices, cache invalidation when vLLM rewrites a slot."""

from __future__ import annotations

import pytest
import torch

from engine.worker.batch_plan import plan_batch
from engine.worker.fused_ops import FusedWeightCache, fused_expand, fused_shrink

SLICES = (12, 6, 6)
MAX_RANK, HIDDEN = 8, 16


def _stacked(ranks: list[int], seed: int):
    """vLLM's layout: per slice [slots, 1, max_rank, hidden] / [slots, 1, out, max_rank], zero past the rank."""
    g = torch.Generator().manual_seed(seed)
    lora_a, lora_b = [], []
    for out in SLICES:
        a, b = torch.zeros(len(ranks), 1, MAX_RANK, HIDDEN), torch.zeros(len(ranks), 1, out, MAX_RANK)
        for slot, r in enumerate(ranks):
            a[slot, 0, :r] = torch.randn(r, HIDDEN, generator=g)
            b[slot, 0, :, :r] = torch.randn(out, r, generator=g)
        lora_a.append(a)
        lora_b.append(b)
    return tuple(lora_a), tuple(lora_b)


def _reference(x, lora_a, lora_b, indices, scale):
    out = torch.zeros(x.shape[0], sum(SLICES))
    for t, slot in enumerate(indices.tolist()):
        if slot < 0:
            continue
        offset = 0
        for a, b, size in zip(lora_a, lora_b, SLICES):
            out[t, offset:offset + size] = b[slot, 0] @ (a[slot, 0] @ x[t]) * scale
            offset += size
    return out


def _apply(x, lora_a, lora_b, indices, cache, scale=0.5):
    plan = plan_batch(indices)
    buffer = torch.zeros(len(SLICES), x.shape[0], MAX_RANK)
    y = torch.zeros(x.shape[0], sum(SLICES))
    fused_shrink(buffer, x, lora_a, plan.padded, scale, cache)
    fused_expand(y, buffer, lora_b, SLICES, 0, plan.padded, True, cache)
    return y


@pytest.mark.parametrize("ranks,indices", [
    ([2, 5, 8], [0, 1, 2, -1, 0, 1]),
    ([3, 3], [1, 1, 1]),
    ([1, 8, 4], [2, -1, 2, 0]),
])
def test_fused_matches_reference_with_padded_ranks(ranks, indices):
    lora_a, lora_b = _stacked(ranks, seed=len(indices))
    indices = torch.tensor(indices)
    x = torch.randn(len(indices), HIDDEN)
    y = _apply(x, lora_a, lora_b, indices, FusedWeightCache())
    torch.testing.assert_close(y, _reference(x, lora_a, lora_b, indices, 0.5), rtol=1e-5, atol=1e-5)


def test_cache_sees_in_place_rewrites_of_a_slot():
    """vLLM loads a different adapter into a slot with copy_: the cached fused weights must not survive it."""
    lora_a, lora_b = _stacked([2, 4], seed=0)
    indices, x, cache = torch.tensor([0, 1, 0]), torch.randn(3, HIDDEN), FusedWeightCache()
    _apply(x, lora_a, lora_b, indices, cache)
    new_a, new_b = _stacked([6, 4], seed=1)
    for old, new in zip(lora_a + lora_b, new_a + new_b):
        old[0].copy_(new[0])  # slot 0 now holds a rank-6 adapter
    y = _apply(x, lora_a, lora_b, indices, cache)
    torch.testing.assert_close(y, _reference(x, lora_a, lora_b, indices, 0.5), rtol=1e-5, atol=1e-5)


def test_unadapted_module_is_skipped():
    """All-zero stacked weights (adapters not targeting the module): no work, output untouched."""
    plan = plan_batch(torch.tensor([0, 1]))
    lora_a, lora_b = (torch.zeros(2, 1, MAX_RANK, HIDDEN),), (torch.zeros(2, 1, 6, MAX_RANK),)
    buffer, y = torch.zeros(1, 2, MAX_RANK), torch.randn(2, 6)
    before = y.clone()
    cache = FusedWeightCache()
    fused_shrink(buffer, torch.randn(2, HIDDEN), lora_a, plan.padded, 1.0, cache)
    fused_expand(y, buffer, lora_b, (6,), 0, plan.padded, True, cache)
    assert torch.equal(y, before)


def test_cache_keeps_a_slot_range_apart_from_two_slots():
    """Slots 0, 1, 2 (a range) and slots 0 and 3 (a list) once shared a cache key: the next step ran with the
    other batch's weights and vLLM's worker died on a shape mismatch."""
    lora_a, lora_b = _stacked([2, 4, 8, 3], seed=2)
    cache = FusedWeightCache()
    for indices in ([0, 1, 2, 0], [0, 3, 3]):
        indices = torch.tensor(indices)
        x = torch.randn(len(indices), HIDDEN)
        y = _apply(x, lora_a, lora_b, indices, cache)
        torch.testing.assert_close(y, _reference(x, lora_a, lora_b, indices, 0.5), rtol=1e-5, atol=1e-5)
