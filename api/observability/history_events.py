"""Adapter tier events for both the metrics and the dashboard history: a drop-in `TierEvents` (adapters/tiers.py).

The tiers report residency as idempotent `set_resident` calls (a disk hit re-asserts "resident on disk"), so a load
is a change from not resident to resident, tracked here per (adapter, tier); an eviction is each `evicted` call.
"""

from __future__ import annotations

import threading

from adapters.tiers import TierEvents
from api.observability.history import History


class HistoryTierEvents:
    """Forwards every call to `inner` (the server's `Metrics`), then notes loads and evictions in `history`.

    Memory: one entry per adapter currently resident in a tier, so bounded by the tier sizes.
    """

    def __init__(self, inner: TierEvents, history: History):
        self._inner = inner
        self._history = history
        self._resident: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def cache_hit(self, adapter: str, tier: str) -> None:
        self._inner.cache_hit(adapter, tier)

    def cache_miss(self, adapter: str, tier: str) -> None:
        self._inner.cache_miss(adapter, tier)

    def observe_load(self, tier: str, seconds: float) -> None:
        self._inner.observe_load(tier, seconds)

    def evicted(self, adapter: str, tier: str) -> None:
        self._inner.evicted(adapter, tier)
        with self._lock:
            self._resident.discard((adapter, tier))
        self._history.event("evict", adapter, tier)

    def set_resident(self, adapter: str, tier: str, resident: bool) -> None:
        self._inner.set_resident(adapter, tier, resident)
        key = (adapter, tier)
        with self._lock:
            arrived = resident and key not in self._resident
            if resident:
                self._resident.add(key)
            else:
                self._resident.discard(key)
        if arrived:
            self._history.event("load", adapter, tier)
