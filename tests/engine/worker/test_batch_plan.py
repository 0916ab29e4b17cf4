"""Batch planning: tokens grouped by adapter slot, and their padded layout."""

from __future__ import annotations

import pytest
import torch

from engine.worker.batch_plan import TokenGroup, plan_batch, segments, token_groups


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


@pytest.mark.parametrize("indices,order,starts,slots", [
    ([], [], [0], []),
    ([-1, -1], [], [0], []),
    ([2, 0, 2, -1, 0], [1, 4, 0, 2], [0, 2, 4], [0, 2]),
    ([1, 1, 1], [0, 1, 2], [0, 3], [1]),
])
def test_segments_sort_tokens_by_slot_keeping_batch_order(indices, order, starts, slots):
    seg = segments(torch.tensor(indices, dtype=torch.int64))
    assert (seg.order.tolist(), seg.starts.tolist(), seg.slots.tolist()) == (order, starts, slots)
