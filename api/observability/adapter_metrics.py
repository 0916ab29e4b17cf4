"""Prometheus metrics of the adapter tiers: hits, misses, load times, evictions and residency per adapter version.

The tiers report here through `adapters.tiers.TierEvents`; adapter labels are bounded by `top_n`.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from adapters.tiers import TIERS
from api.observability.labels import LabelBounder

LOAD_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class AdapterMetrics:
    def __init__(self, registry: CollectorRegistry, top_n: int):
        r = registry
        self._adapters = LabelBounder(top_n)
        self._lock = threading.Lock()
        self._resident: dict[str, set[str]] = {tier: set() for tier in TIERS}
        self.cache_hits = Counter("loraplex_adapter_cache_hits", "Adapter found in a tier.", ("adapter", "tier"),
                                  registry=r)
        self.cache_misses = Counter("loraplex_adapter_cache_misses", "Adapter not found in a tier.",
                                    ("adapter", "tier"), registry=r)
        self.load_time = Histogram("loraplex_adapter_load_seconds", "Time to bring an adapter into a tier.",
                                   ("tier",), buckets=LOAD_BUCKETS, registry=r)
        self.evictions = Counter("loraplex_adapter_evictions", "Adapters evicted from a tier.", ("tier",),
                                 registry=r)
        # 0/1 per adapter; the `other` label counts every resident adapter folded into it.
        self.resident = Gauge("loraplex_adapter_resident", "Adapters resident in a tier.", ("adapter", "tier"),
                              registry=r)

    def cache_hit(self, adapter: str, tier: str) -> None:
        self.cache_hits.labels(adapter=self._adapters.bound(adapter), tier=_tier(tier)).inc()

    def cache_miss(self, adapter: str, tier: str) -> None:
        self.cache_misses.labels(adapter=self._adapters.bound(adapter), tier=_tier(tier)).inc()

    def observe_load(self, tier: str, seconds: float) -> None:
        self.load_time.labels(tier=_tier(tier)).observe(seconds)

    def evicted(self, adapter: str, tier: str) -> None:
        """An adapter left a tier; it is no longer resident there."""
        self.evictions.labels(tier=_tier(tier)).inc()
        self.set_resident(adapter, tier, False)

    def set_resident(self, adapter: str, tier: str, resident: bool) -> None:
        label = self._adapters.bound(adapter)
        with self._lock:
            members = self._resident[_tier(tier)]
            if resident:
                members.add(adapter)
            else:
                members.discard(adapter)
            count = sum(1 for a in members if self._adapters.bound(a) == label)
        self.resident.labels(adapter=label, tier=tier).set(count)


def _tier(tier: str) -> str:
    if tier not in TIERS:
        raise ValueError(f"unknown adapter tier {tier!r}; expected one of {TIERS}")
    return tier
