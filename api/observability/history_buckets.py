"""What one bucket of the dashboard history holds: per-group counts and latency, and the gauges sampled in it.

Two forms of per-group data. `Aggregate` is live: counters and two `LatencyHistogram`s, mergeable, written on the
request path (~1 KB a group). `Summaries` is final: once a bucket's minute has been rolled up nothing merges it
again, so it keeps per group only the counts and the p50/p95/p99 its histograms gave, as one row of 11 doubles in a
flat array (88 bytes a group), the group-to-row map shared between buckets. `Gauges` is flat the same way. With
~100 groups busy all day that is ~30 MB instead of ~200 MB with histograms and dicts kept.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from api.observability.latency_histogram import LatencyHistogram
from api.observability.outcome import STATUS_CLIENT_CLOSED
from api.observability.slo import OBJECTIVES

STATUS_CLASSES = ("2xx", "4xx", "5xx", "499")  # "2xx" counts every status under 400
PERCENTILES = (50.0, 95.0, 99.0)
LATENCIES = ("ttft", "tpot")


def status_class(status: int) -> int:
    """Index into STATUS_CLASSES; 499 (client went away) is its own class, not a 4xx."""
    if status == STATUS_CLIENT_CLOSED:
        return 3
    return 2 if status >= 500 else 1 if status >= 400 else 0


class Aggregate:
    """Counts of one group in one live bucket. Not thread-safe: the history's lock guards it."""

    __slots__ = ("output_tokens", "requests", "tpot", "ttft")

    def __init__(self) -> None:
        self.requests = [0, 0, 0, 0]  # by STATUS_CLASSES
        self.output_tokens = 0
        self.ttft = LatencyHistogram()
        self.tpot = LatencyHistogram()

    def merge(self, other: Aggregate) -> None:
        for i, n in enumerate(other.requests):
            self.requests[i] += n
        self.output_tokens += other.output_tokens
        self.ttft.merge(other.ttft)
        self.tpot.merge(other.tpot)

    def copy(self) -> Aggregate:
        twin = Aggregate()
        twin.merge(self)
        return twin

    def percentiles(self, latency: str) -> tuple[float | None, ...]:
        """PERCENTILES of "ttft" or "tpot", from the histogram now."""
        histogram = self.ttft if latency == "ttft" else self.tpot
        return tuple(histogram.percentile(p) for p in PERCENTILES)

    def summary_row(self) -> list[float]:
        """[4 status-class counts, output tokens, ttft p50/p95/p99, tpot p50/p95/p99], NaN for no value."""
        return [*self.requests, self.output_tokens,
                *(math.nan if v is None else v for name in LATENCIES for v in self.percentiles(name))]


SUMMARY_WIDTH = len(STATUS_CLASSES) + 1 + len(LATENCIES) * len(PERCENTILES)


class Summary(array):
    """One group's row of a `Summaries`, read side: what `Aggregate` answers, from the stored numbers."""

    __slots__ = ()
    _TOKENS = len(STATUS_CLASSES)

    def __new__(cls, values: Sequence[float]):
        return super().__new__(cls, "d", values)

    @property
    def requests(self) -> list[int]:
        return [int(v) for v in self[:self._TOKENS]]

    @property
    def output_tokens(self) -> int:
        return int(self[self._TOKENS])

    def percentiles(self, latency: str) -> tuple[float | None, ...]:
        start = self._TOKENS + 1 + LATENCIES.index(latency) * len(PERCENTILES)
        return tuple(None if math.isnan(v) else v for v in self[start:start + len(PERCENTILES)])


class Summaries:
    """The final per-group data of one bucket: `offsets` maps a group to its row of SUMMARY_WIDTH in `values`."""

    __slots__ = ("offsets", "values")

    def __init__(self, groups: Mapping[str, Aggregate], reuse: Mapping[str, int] | None):
        """`reuse`: another bucket's offsets, shared when the groups are the same."""
        self.offsets = _offsets(groups, reuse)
        self.values = array("d")
        for group in self.offsets:
            self.values.extend(groups[group].summary_row())

    def get(self, group: str) -> Summary | None:
        row = self.offsets.get(group)
        if row is None:
            return None
        return Summary(self.values[row * SUMMARY_WIDTH:(row + 1) * SUMMARY_WIDTH])


def _offsets(groups: Iterable[str], reuse: Mapping[str, int] | None) -> Mapping[str, int]:
    ordered = sorted(groups)
    if reuse is not None and list(reuse) == ordered:
        return reuse
    return {g: i for i, g in enumerate(ordered)}


class SloPoint(NamedTuple):
    """One objective of one group at sample time (`dashboard_snapshot`'s `threshold_s` and `budget_remaining`)."""

    threshold_s: float | None
    budget_remaining: float | None


# Per group in a sample: queued, running, then (threshold, budget left) per objective.
GAUGE_FIELDS = ("queued", "running", *(f"{o}_{f}" for o in OBJECTIVES for f in ("threshold_s", "budget_remaining")))
_FIELD = {name: i for i, name in enumerate(GAUGE_FIELDS)}


class Gauges:
    """What one `sample` saw, flat: `offsets` maps a group to its row in `values` (NaN: not given)."""

    __slots__ = ("offsets", "residency", "values")

    def __init__(self, offsets: Mapping[str, int], values: array, residency: tuple[int, ...]):
        self.offsets = offsets
        self.values = values
        self.residency = residency  # adapters per tier, in TIERS order

    @classmethod
    def build(cls, queued: Mapping[str, int], running: Mapping[str, int], slo: Mapping[str, Mapping[str, SloPoint]],
              residency: tuple[int, ...], reuse: Mapping[str, int] | None) -> Gauges:
        """`reuse`: the previous sample's offsets, shared when the groups are the same (they usually are)."""
        offsets = _offsets(set(queued) | set(running) | set(slo), reuse)
        values = array("d", [math.nan]) * (len(offsets) * len(GAUGE_FIELDS))
        for group, row in offsets.items():
            base = row * len(GAUGE_FIELDS)
            if group in queued:
                values[base] = queued[group]
            if group in running:
                values[base + 1] = running[group]
            for objective, point in slo.get(group, {}).items():
                for name, value in zip(("threshold_s", "budget_remaining"), point):
                    if value is not None and f"{objective}_{name}" in _FIELD:
                        values[base + _FIELD[f"{objective}_{name}"]] = value
        return cls(offsets, values, residency)

    def get(self, group: str, name: str) -> float | None:
        """GAUGE_FIELDS `name` of `group`; None when the sample did not give it."""
        row = self.offsets.get(group)
        if row is None:
            return None
        value = self.values[row * len(GAUGE_FIELDS) + _FIELD[name]]
        return None if math.isnan(value) else value


@dataclass
class Bucket:
    index: int  # start time // resolution seconds
    groups: dict[str, Aggregate] | Summaries = field(default_factory=dict)  # Summaries once its minute rolled up
    gauges: Gauges | None = None


class Ring:
    """`slots` buckets addressed by index % slots; a slot holding an older index is stale and reads as absent."""

    def __init__(self, slots: int):
        self._slots: list[Bucket | None] = [None] * slots

    def get(self, index: int) -> Bucket | None:
        bucket = self._slots[index % len(self._slots)]
        return bucket if bucket is not None and bucket.index == index else None

    def get_or_create(self, index: int) -> Bucket:
        slot = index % len(self._slots)
        bucket = self._slots[slot]
        if bucket is None or bucket.index != index:
            bucket = self._slots[slot] = Bucket(index)  # a new object: readers holding the old one are unaffected
        return bucket

    def put(self, bucket: Bucket) -> None:
        self._slots[bucket.index % len(self._slots)] = bucket
