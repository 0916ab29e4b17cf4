"""What an engine replica tells the server about itself: first and last on every response."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReplicaReport:
    """One replica's state when a request reached it, or when it left."""

    replica_id: str
    node_id: str
    pid: int
    residency: dict[str, list[str]]  # tier (engine, cpu) -> adapter labels, most recently used last
    running: int
    waiting: int
    kv_cache_usage: float
    ongoing: int  # generate calls in progress on the replica, this one included
    loads: int  # adapter loads into this replica's engine since it started
    load_seconds: float  # their summed time
    generation_tokens: int


@dataclass
class ReplicaTierCounts:
    """`adapters.tiers.TierEvents` kept inside a replica: counts, for its reports."""

    hits: Counter[str] = field(default_factory=Counter)  # by tier
    misses: Counter[str] = field(default_factory=Counter)
    evictions: Counter[str] = field(default_factory=Counter)
    engine_loads: int = 0
    engine_load_seconds: float = 0.0

    def cache_hit(self, adapter: str, tier: str) -> None:
        self.hits[tier] += 1

    def cache_miss(self, adapter: str, tier: str) -> None:
        self.misses[tier] += 1

    def observe_load(self, tier: str, seconds: float) -> None:
        if tier == "cpu":
            self.engine_loads += 1
            self.engine_load_seconds += seconds

    def evicted(self, adapter: str, tier: str) -> None:
        self.evictions[tier] += 1

    def set_resident(self, adapter: str, tier: str, resident: bool) -> None:
        pass
