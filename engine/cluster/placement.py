"""Which engine replicas hold which adapters from their start: pins on every replica, and an adapter that asks for
N replicas (`--adapter-replicas NAME=N`) on N of them. A pure function of the replica's rank (Ray Serve numbers a
deployment's replicas 0..world_size-1, and a replacement takes the rank of the one it replaces)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping


def holder_ranks(ref: str, replicas: int, world_size: int) -> frozenset[int]:
    """The ranks holding `ref`: `replicas` consecutive ones (at most all), from a start its name's CRC picks, so
    different adapters start on different replicas. CRC, not hash(): every replica process must agree."""
    if world_size <= 0:
        return frozenset()
    start = zlib.crc32(ref.encode()) % world_size
    return frozenset((start + i) % world_size for i in range(min(replicas, world_size)))


def held_here(pins: tuple[str, ...], targets: Mapping[str, int], rank: int, world_size: int) -> tuple[str, ...]:
    """What the replica of `rank` preloads and never evicts: every pin, then each target it is a holder of."""
    held = [ref for ref, n in sorted(targets.items()) if rank in holder_ranks(ref, n, world_size)]
    return tuple(dict.fromkeys([*pins, *held]))
