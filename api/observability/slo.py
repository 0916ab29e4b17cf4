"""Latency and availability objectives, and the arithmetic of attainment, error budget and burn rate."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class LatencyTarget(BaseModel):
    """`percentile` of requests must take at most `seconds`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seconds: float = Field(gt=0, description="Threshold in seconds.")
    percentile: float = Field(default=95.0, gt=0, lt=100, description="Share of requests, in percent.")


class SloTargets(BaseModel):
    """Objectives of one tenant or priority class. A missing target is not tracked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft: LatencyTarget | None = Field(default=None, description="Time to first token.")
    tpot: LatencyTarget | None = Field(default=None, description="Time per output token after the first.")
    e2e: LatencyTarget | None = Field(default=None, description="End-to-end request latency.")
    availability: float = Field(default=99.0, gt=0, lt=100,
                                description="Percent of requests that must succeed (non-5xx).")


DEFAULT_SLO = SloTargets(
    ttft=LatencyTarget(seconds=0.5, percentile=95.0),
    tpot=LatencyTarget(seconds=0.1, percentile=95.0),
    e2e=LatencyTarget(seconds=10.0, percentile=95.0),
    availability=99.0,
)


# --- Pure arithmetic -------------------------------------------------------------------------------------------------

def count_met(samples: Sequence[float], threshold_s: float) -> int:
    """Samples at or under the threshold."""
    return sum(1 for s in samples if s <= threshold_s)


def attainment(samples: Sequence[float], threshold_s: float) -> float:
    """Share of samples at or under the threshold; 1.0 for no samples (nothing was missed)."""
    if not samples:
        return 1.0
    return count_met(samples, threshold_s) / len(samples)


def percentile(samples: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile: the smallest sample with at least `p` percent of samples at or under it.

    Always an observed value (never interpolated), so p99 of few samples is their maximum. None for no samples.
    """
    if not samples:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {p}")
    ordered = sorted(samples)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def error_budget_remaining(good: int, total: int, target_percent: float) -> float:
    """Share of the error budget left: 1.0 untouched, 0.0 spent, negative when overspent; 1.0 with no traffic.

    The budget is the number of bad requests the target allows, `(1 - target/100) * total`.
    """
    if total <= 0:
        return 1.0
    allowed_bad = (1 - target_percent / 100) * total
    return 1 - (total - good) / allowed_bad


def burn_rate(good: int, total: int, target_percent: float) -> float:
    """Bad ratio over the allowed bad ratio: 1.0 spends the budget exactly over the window; 0 with no traffic."""
    if total <= 0:
        return 0.0
    return ((total - good) / total) / (1 - target_percent / 100)


# --- Sliding windows ------------------------------------------------------------------------------------------------

LATENCY_OBJECTIVES = ("ttft", "tpot", "e2e")
OBJECTIVES = (*LATENCY_OBJECTIVES, "availability")
WINDOWS: dict[str, float] = {"5m": 300.0, "1h": 3600.0}
# Per (tenant, model_version). At the cap the oldest samples go first, so under more than
# ~1.4 requests/s per key the "1h" window covers the most recent 5000 requests instead of a full hour.
MAX_SAMPLES_PER_KEY = 5000


@dataclass(frozen=True)
class Sample:
    at: float  # tracker clock
    ttft: float | None
    tpot: float | None
    e2e: float | None
    success: bool


@dataclass(frozen=True)
class ObjectiveStatus:
    good: int
    total: int
    attainment: float  # good / total; 1.0 with no traffic
    budget_remaining: float
    burn_rate: float
    target_percent: float  # mean of the targets of the counted requests (their tenants may differ)
    threshold_s: float | None  # None for availability, or when the tenants of a group disagree

    @property
    def met(self) -> bool | None:
        """Attainment at or over the target; None with no traffic."""
        if self.total == 0:
            return None
        return self.attainment * 100 >= self.target_percent - 1e-9


@dataclass(frozen=True)
class Percentiles:
    p50: float | None
    p95: float | None
    p99: float | None


@dataclass(frozen=True)
class WindowSummary:
    requests: int
    errors: int  # requests that failed the availability objective (5xx)
    objectives: dict[str, ObjectiveStatus]  # only objectives some tenant of the group tracks
    latency: dict[str, Percentiles]  # ttft, tpot, e2e; empty when not asked for

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


Key = tuple[str, str]  # (tenant, model_version)


class SloWindowTracker:
    """Recent requests per (tenant, model_version), summarised against each tenant's objectives.

    Thread-safe. Samples older than the longest window are dropped when their key records, and from every key
    (emptied keys included) on each summary.
    """

    def __init__(self, slo_for: Callable[[str], SloTargets], clock: Callable[[], float] = time.monotonic,
                 max_samples_per_key: int = MAX_SAMPLES_PER_KEY, windows: Mapping[str, float] = WINDOWS):
        self._slo_for = slo_for
        self._clock = clock
        self._max_samples = max_samples_per_key
        self._windows = dict(windows)
        self._horizon = max(self._windows.values())
        self._samples: dict[Key, deque[Sample]] = {}
        self._lock = threading.Lock()

    def record(self, tenant: str, model_version: str, *, ttft: float | None, tpot: float | None,
               e2e: float | None, success: bool) -> None:
        now = self._clock()
        with self._lock:
            samples = self._samples.get((tenant, model_version))
            if samples is None:
                samples = self._samples[(tenant, model_version)] = deque(maxlen=self._max_samples)
            samples.append(Sample(now, ttft, tpot, e2e, success))
            while now - samples[0].at > self._horizon:
                samples.popleft()

    def summaries(self, group: Callable[[str, str], Hashable] | None = None, *, latency: bool = True
                  ) -> dict[Hashable, dict[str, WindowSummary]]:
        """Per group (default: the (tenant, model_version) key), per window name, the summary.

        A group spanning tenants judges each request by its own tenant's objectives. `latency=False` skips
        the percentiles (a sort per window), for callers that need only the objectives.
        """
        now = self._clock()
        with self._lock:
            self._prune(now)
            snapshot = {key: list(samples) for key, samples in self._samples.items()}
        grouped: dict[Hashable, list[tuple[str, list[Sample]]]] = {}
        for (tenant, model_version), samples in snapshot.items():
            gkey = group(tenant, model_version) if group else (tenant, model_version)
            grouped.setdefault(gkey, []).append((tenant, samples))
        return {
            gkey: {name: self._summarize([(t, [s for s in ss if now - s.at <= span]) for t, ss in parts], latency)
                   for name, span in self._windows.items()}
            for gkey, parts in grouped.items()
        }

    def _prune(self, now: float) -> None:
        for key in list(self._samples):
            samples = self._samples[key]
            while samples and now - samples[0].at > self._horizon:
                samples.popleft()
            if not samples:
                del self._samples[key]

    def _summarize(self, parts: list[tuple[str, list[Sample]]], latency: bool) -> WindowSummary:
        targets = [(self._slo_for(tenant), samples) for tenant, samples in parts]
        objectives = {}
        for name in LATENCY_OBJECTIVES:
            tracked = [(getattr(t, name), ss) for t, ss in targets if getattr(t, name) is not None]
            if tracked:
                objectives[name] = _latency_status(name, tracked)
        objectives["availability"] = _availability_status([(t.availability, ss) for t, ss in targets])
        every = [s for _, ss in parts for s in ss]
        percentiles = {name: _percentiles([getattr(s, name) for s in every if getattr(s, name) is not None])
                       for name in LATENCY_OBJECTIVES} if latency else {}
        return WindowSummary(requests=len(every), errors=sum(1 for s in every if not s.success),
                             objectives=objectives, latency=percentiles)


def _percentiles(values: list[float]) -> Percentiles:
    return Percentiles(percentile(values, 50), percentile(values, 95), percentile(values, 99))


def _status(good: int, total: int, target_sum: float, targets: list[float],
            threshold_s: float | None) -> ObjectiveStatus:
    # With no traffic the target is only shown, so the plain mean of the tenants' targets stands in.
    target = target_sum / total if total else sum(targets) / len(targets)
    return ObjectiveStatus(good=good, total=total, attainment=good / total if total else 1.0,
                           budget_remaining=error_budget_remaining(good, total, target),
                           burn_rate=burn_rate(good, total, target), target_percent=target,
                           threshold_s=threshold_s)


def _latency_status(name: str, tracked: list[tuple[LatencyTarget, list[Sample]]]) -> ObjectiveStatus:
    good = total = 0
    target_sum = 0.0
    for target, samples in tracked:
        values = [getattr(s, name) for s in samples if getattr(s, name) is not None]
        good += count_met(values, target.seconds)
        total += len(values)
        target_sum += target.percentile * len(values)
    thresholds = {target.seconds for target, _ in tracked}
    return _status(good, total, target_sum, [t.percentile for t, _ in tracked],
                   thresholds.pop() if len(thresholds) == 1 else None)


def _availability_status(tracked: list[tuple[float, list[Sample]]]) -> ObjectiveStatus:
    good = sum(1 for _, samples in tracked for s in samples if s.success)
    total = sum(len(samples) for _, samples in tracked)
    target_sum = sum(target * len(samples) for target, samples in tracked)
    return _status(good, total, target_sum, [t for t, _ in tracked], None)
