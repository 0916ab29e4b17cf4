"""Adapter-affinity replica choice, as a pure function: which replicas a request should try, best first.

A request goes to a replica that already holds its adapter version (no cold load), unless every holder is at or
over the load threshold or has too many of the adapter's requests waiting in its engine; then the least loaded
replica takes it and loads the adapter too, so a hot adapter spreads over as many replicas as its load needs.
Requests for the base model go to the least loaded replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaView:
    """What the router knows of one replica: its id, the adapters resident in its engine, its ongoing requests, and
    adapters with at least the router's threshold of requests waiting in its engine (the router names only the
    request's own)."""

    replica_id: str
    resident: frozenset[str]
    ongoing: int
    starved: frozenset[str] = frozenset()


def rank_replicas(adapter: str | None, replicas: Sequence[ReplicaView], max_ongoing: int) -> list[list[str]]:
    """Replica ids in ranks, best rank first: [[the holder to use]] or [[least loaded], [the rest]].

    Ties in load keep the order of `replicas` (callers shuffle it to spread ties)."""
    if not replicas:
        return []
    by_load = sorted(replicas, key=lambda r: r.ongoing)
    if adapter is not None:
        holders = [r for r in by_load
                   if adapter in r.resident and adapter not in r.starved and r.ongoing < max_ongoing]
        if holders:
            rest = [r.replica_id for r in by_load if r is not holders[0]]
            return [[holders[0].replica_id], rest] if rest else [[holders[0].replica_id]]
    first, rest = by_load[0], [r.replica_id for r in by_load[1:]]
    return [[first.replica_id], rest] if rest else [[first.replica_id]]
