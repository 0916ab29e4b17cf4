"""A small fixed-bucket latency histogram: O(log buckets) to add, percentiles estimated at read time.

Why not samples: the dashboard history keeps one histogram per (interval, group) for a day, so its memory must not
grow with traffic. Why these buckets: geometric with ratio 2**(1/4) from 1 ms to about 5 min, so an estimate is at
most ~19% above the true value (never below it), which is finer than the SLO thresholds it is drawn against.
"""

from __future__ import annotations

import math
from bisect import bisect_left

RATIO = 2 ** 0.25
# Upper bounds in seconds, inclusive: a value v lands in the first bucket with v <= bound; above the last, overflow.
BOUNDS: tuple[float, ...] = tuple(0.001 * RATIO ** i for i in range(74))  # 1 ms .. ~296 s
OVERFLOW = len(BOUNDS)


def bucket_of(seconds: float) -> int:
    """Index of the bucket holding `seconds`; OVERFLOW above the last bound."""
    return bisect_left(BOUNDS, seconds)


class LatencyHistogram:
    """Counts per bucket index, sparse (an interval usually touches a handful of buckets), plus the max seen.

    Not thread-safe by itself: its owner holds a lock.
    """

    __slots__ = ("counts", "max_seen", "total")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0
        self.max_seen = 0.0

    def add(self, index: int, seconds: float) -> None:
        """`index` is `bucket_of(seconds)`, computed by the caller outside its lock."""
        self.counts[index] = self.counts.get(index, 0) + 1
        self.total += 1
        self.max_seen = max(self.max_seen, seconds)

    def merge(self, other: LatencyHistogram) -> None:
        for index, n in other.counts.items():
            self.counts[index] = self.counts.get(index, 0) + n
        self.total += other.total
        self.max_seen = max(self.max_seen, other.max_seen)

    def percentile(self, p: float) -> float | None:
        """Nearest rank over buckets: the upper bound of the bucket holding the ceil(p% * n)-th value, capped at
        the largest value seen (so p100 is exact and an overflow bucket reports the max). None when empty."""
        if not 0 < p <= 100:
            raise ValueError(f"percentile must be within (0, 100], got {p}")
        if self.total == 0:
            return None
        rank = max(1, math.ceil(p / 100 * self.total))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                return self.max_seen if index == OVERFLOW else min(BOUNDS[index], self.max_seen)
        raise RuntimeError("histogram counts do not add up to its total")  # unreachable unless corrupted
