"""In-memory history behind the dashboard charts: per-interval aggregates in two bounded rings.

Resolutions: "10s" (360 buckets, one hour) and "1m" (1440 buckets, one day). The request path (`record`) touches only
the current 10 s bucket: per group, four status-class counters, an output-token counter and two small latency
histograms (`latency_histogram`), so its cost does not grow with traffic or history. Whole minutes are rolled up from
the 10 s ring into the 1 m ring by `sample` and by reads; the 10 s ring holds an hour, so the roll-up may lag 59
minutes without loss. Percentiles of live buckets (the current minute) are computed from their histograms when read;
a rolled-up minute, and its 10 s buckets, keep only `Summaries` (counts and the p50/p95/p99 their histograms gave),
since nothing merges them again (`history_buckets` says what that saves).

Gauges (admission queue and running, residency counts, SLO budgets and thresholds) are set once per interval by
`sample`; the last sample of a minute stands for that minute. Adapter loads and evictions are timestamped events in
a bounded deque.

Groups: "all", "tenant:<label>" and "model:<model@version label>", labels from caller-supplied bounding functions
(the server's `LabelBounder`s), so at most 1 + 2 * (top_n + pinned + 1) groups per bucket.

No clock is read except the injected `now`; nothing survives the process. Thread-safe (one lock).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from adapters.tiers import TIERS
from api.observability.history_buckets import (
    Aggregate,
    Bucket,
    Gauges,
    Ring,
    SloPoint,
    Summaries,
    Summary,
    status_class,
)
from api.observability.latency_histogram import bucket_of
from api.observability.outcome import RequestOutcome
from api.observability.request_metrics import AdmissionCounts


@dataclass(frozen=True)
class Resolution:
    name: str
    seconds: int  # bucket width
    slots: int  # buckets kept


FINE = Resolution("10s", 10, 360)
COARSE = Resolution("1m", 60, 1440)
RESOLUTIONS = {r.name: r for r in (FINE, COARSE)}
FINE_PER_COARSE = COARSE.seconds // FINE.seconds
ALL = "all"
EVENT_KINDS = ("load", "evict")
MAX_EVENTS = 2000


def tenant_group(label: str) -> str:
    return f"tenant:{label}"


def model_group(label: str) -> str:
    return f"model:{label}"


class Event(NamedTuple):
    at: float
    kind: str  # EVENT_KINDS
    adapter: str  # "name@version" label
    tier: str  # TIERS


class History:
    """`tenant_label(raw tenant)` and `model_label("model@version")` bound group labels; `now()` is unix time."""

    def __init__(self, tenant_label: Callable[[str], str], model_label: Callable[[str], str],
                 now: Callable[[], float], max_events: int = MAX_EVENTS):
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events}")
        self._tenant_label = tenant_label
        self._model_label = model_label
        self._now = now
        self.started_at = now()
        self._fine = Ring(FINE.slots)
        self._coarse = Ring(COARSE.slots)
        self._latest = int(self.started_at // FINE.seconds)  # newest 10 s bucket; the only one still written
        self._rolled_to = self._latest // FINE_PER_COARSE  # minutes before this one are in the 1 m ring
        self._events: deque[Event] = deque(maxlen=max_events)
        self._last_seen: dict[str, float] = {ALL: self.started_at}  # group -> last record
        # The last group-to-row maps, shared by the next sample or summary when its groups are the same.
        self._offsets: Mapping[str, int] | None = None
        self._summary_offsets: Mapping[str, int] | None = None
        self._lock = threading.Lock()

    # --- writers ------------------------------------------------------------------------------------------------

    def record(self, outcome: RequestOutcome) -> None:
        """One finished request. Latency counts only served requests (status < 400), as the SLOs do."""
        groups = (ALL, tenant_group(self._tenant_label(outcome.tenant)),
                  model_group(self._model_label(outcome.model_version)))
        klass = status_class(outcome.status)
        served = outcome.status < 400
        ttft = outcome.ttft_seconds if served else None
        tpot = outcome.tpot_seconds if served else None
        ttft_at = bucket_of(ttft) if ttft is not None else -1
        tpot_at = bucket_of(tpot) if tpot is not None else -1
        now = self._now()
        with self._lock:
            bucket = self._fine.get_or_create(self._advance(now))
            for group in groups:
                agg = bucket.groups.get(group)
                if agg is None:
                    agg = bucket.groups[group] = Aggregate()
                agg.requests[klass] += 1
                agg.output_tokens += outcome.completion_tokens
                if ttft is not None:
                    agg.ttft.add(ttft_at, ttft)
                if tpot is not None:
                    agg.tpot.add(tpot_at, tpot)
                self._last_seen[group] = now

    def sample(self, admission: Mapping[str, AdmissionCounts], residency: Mapping[str, int],
               slo: Mapping[str, Mapping[str, SloPoint]]) -> None:
        """Gauges for the current interval (call once per 10 s; a later call in the same interval replaces it).

        `admission` maps raw tenant names to their counts (the server's admission source), `residency` maps a tier
        to its adapter count, `slo` maps a group to its objectives (see `slo_points`). Also rolls up whole minutes.
        """
        queued, running = {ALL: 0}, {ALL: 0}
        for tenant, counts in admission.items():
            group = tenant_group(self._tenant_label(tenant))
            queued[group] = queued.get(group, 0) + counts.queued
            running[group] = running.get(group, 0) + counts.running
            queued[ALL] += counts.queued
            running[ALL] += counts.running
        tiers = tuple(int(residency.get(tier, 0)) for tier in TIERS)
        now = self._now()
        with self._lock:
            gauges = Gauges.build(queued, running, slo, tiers, reuse=self._offsets)
            self._offsets = gauges.offsets
            self._fine.get_or_create(self._advance(now)).gauges = gauges
            self._roll_up()

    def event(self, kind: str, adapter: str, tier: str) -> None:
        """An adapter was loaded into or evicted from a tier."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}; expected one of {EVENT_KINDS}")
        if tier not in TIERS:
            raise ValueError(f"unknown adapter tier {tier!r}; expected one of {TIERS}")
        now = self._now()
        with self._lock:
            self._events.append(Event(now, kind, adapter, tier))

    # --- readers ------------------------------------------------------------------------------------------------

    def view(self, resolution: Resolution, group: str, now: float) -> View:
        """The window of `resolution` ending at `now`, for one group, taken under the lock.

        Only the newest 10 s bucket is still written to (records never go back in time, see `_advance`), so it is
        copied; nothing else handed out is mutated any more, so percentiles are computed without the lock.
        """
        with self._lock:
            self._advance(now)
            self._roll_up()
            last = int(now // resolution.seconds)
            starts, aggs, gauges = [], [], []
            for index in range(last - resolution.slots + 1, last + 1):
                if resolution is FINE:
                    bucket = self._fine.get(index)
                elif index >= self._rolled_to:
                    bucket = self._partial_minute(index)  # the current minute: a fresh merge of its 10 s buckets
                else:
                    bucket = self._coarse.get(index)
                agg = bucket.groups.get(group) if bucket is not None else None
                if isinstance(agg, Aggregate) and resolution is FINE and index == self._latest:
                    agg = agg.copy()
                starts.append(index * resolution.seconds)
                aggs.append(agg)
                gauges.append(bucket.gauges if bucket is not None else None)
            since = starts[0]
            groups = sorted((g for g, at in self._last_seen.items() if at >= since or g == ALL),
                            key=lambda g: (g != ALL, not g.startswith("tenant:"), g))
            events = [e for e in self._events if e.at >= since]
        return View(resolution, group, self.started_at, starts, aggs, gauges, groups, events)

    # --- time -----------------------------------------------------------------------------------------------------

    def _advance(self, now: float) -> int:
        """The 10 s bucket a write at `now` goes to: never older than the newest one, so a clock stepping back
        cannot reopen a bucket a reader or the roll-up took as final. Caller holds the lock."""
        self._latest = max(self._latest, int(now // FINE.seconds))
        return self._latest

    def _roll_up(self) -> None:
        """Rolls every minute before the newest bucket's (so final) still held by the 10 s ring into the 1 m ring,
        then keeps only summaries of the minute's 10 s buckets. Caller holds the lock."""
        minute = self._latest // FINE_PER_COARSE
        first = max(self._rolled_to, minute - FINE.slots // FINE_PER_COARSE + 1)  # older ones: partly overwritten
        for index in range(first, minute):
            rolled = self._partial_minute(index)
            if rolled is None:
                continue
            self._coarse.put(Bucket(index, self._summaries(rolled.groups), rolled.gauges))
            for fine in range(index * FINE_PER_COARSE, (index + 1) * FINE_PER_COARSE):
                bucket = self._fine.get(fine)
                if bucket is not None and isinstance(bucket.groups, dict):
                    bucket.groups = self._summaries(bucket.groups)  # a new object: a reader's references stay valid
        self._rolled_to = max(self._rolled_to, minute)

    def _summaries(self, groups: dict[str, Aggregate]) -> Summaries:
        summaries = Summaries(groups, reuse=self._summary_offsets)
        self._summary_offsets = summaries.offsets
        return summaries

    def _partial_minute(self, minute: int) -> Bucket | None:
        """A 1 m bucket merged from the 10 s buckets of `minute` held now; None if there are none. Only minutes not
        yet rolled up are merged, and their 10 s buckets still hold live `Aggregate`s."""
        parts = [b for i in range(minute * FINE_PER_COARSE, (minute + 1) * FINE_PER_COARSE)
                 if (b := self._fine.get(i)) is not None]
        if not parts:
            return None
        merged = Bucket(minute)
        for part in parts:
            for group, agg in part.groups.items():
                into = merged.groups.get(group)
                if into is None:
                    into = merged.groups[group] = Aggregate()
                into.merge(agg)
            if part.gauges is not None:
                merged.gauges = part.gauges  # parts are oldest first: the last sample wins
        return merged


@dataclass(frozen=True)
class View:
    """One group over one window: parallel lists, oldest bucket first, None where nothing was recorded."""

    resolution: Resolution
    group: str
    started_at: float  # when the history (the process) started: earlier buckets have no data at all
    starts: list[float]  # bucket start, unix seconds
    aggregates: list[Aggregate | Summary | None]
    gauges: list[Gauges | None]
    groups: list[str]  # groups with a request in the window: "all", tenants, models
    events: list[Event]  # in the window, oldest first

