from __future__ import annotations

import zlib

import pytest

from engine.cluster.placement import held_here, holder_ranks


def _start(ref: str, world: int) -> int:
    return zlib.crc32(ref.encode()) % world


@pytest.mark.parametrize(("replicas", "world", "count"), [
    (1, 1, 1),
    (1, 4, 1),
    (2, 4, 2),
    (4, 4, 4),
    (6, 4, 4),  # more than there are: every replica
    (2, 0, 0),  # no replica (scaled to zero)
])
def test_holders_are_that_many_consecutive_ranks(replicas, world, count):
    ranks = holder_ranks("poet", replicas, world)
    assert len(ranks) == count
    if count:
        assert ranks == {(_start("poet", world) + i) % world for i in range(count)}


def test_adapters_start_on_different_replicas():
    starts = {min(holder_ranks(f"adapter-{i}", 1, 8)) for i in range(32)}
    assert len(starts) > 4  # not all piled on rank 0


def test_a_replica_holds_every_pin_and_the_targets_placed_on_it():
    world, holders = 3, holder_ranks("poet", 2, 3)
    held = [held_here(("legal",), {"poet": 2}, rank, world) for rank in range(world)]
    assert held.count(("legal", "poet")) == 2 and held.count(("legal",)) == 1
    assert all((h == ("legal", "poet")) == (rank in holders) for rank, h in enumerate(held))


def test_a_pin_that_is_also_a_target_is_held_once():
    assert held_here(("poet",), {"poet": 1}, _start("poet", 2), 2) == ("poet",)
