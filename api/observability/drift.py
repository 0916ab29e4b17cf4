"""Drift of each adapter version's traffic: this window of requests against a reference window, as a population
stability index (PSI) per feature.

Features of each finished sequence: prompt length, output length, mean logprob of the sampled tokens (only where
the engine returned logprobs: the client asked, or a virtual model's run did), finish reason, and the output
tokens themselves (their frequencies). The reference is a version's first `reference_requests` sequences, or a
window pinned by an operator; the current window is the latest `window_requests` sequences after it. PSI is
reported once both are full: sum over bins of (cur - ref) * ln(cur / ref), proportions floored at `PSI_FLOOR`.
Numeric features are binned at the reference's quantiles; categorical ones by value (tokens: the reference's
`top_tokens` most frequent, the rest as one bin). `drift_store.py` keeps the windows across restarts.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import Counter, deque
from collections.abc import AsyncIterator, Hashable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric
from pydantic import BaseModel, ConfigDict, Field

from engine.types import ChoiceDelta

PSI_FLOOR = 1e-4
NUMERIC = ("prompt_tokens", "output_tokens", "mean_logprob")
CATEGORICAL = ("finish_reason", "output_token")
FEATURES = NUMERIC + CATEGORICAL
OTHER_BIN = "other"


class DriftConfig(BaseModel):
    """How drift is judged for each adapter version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    drift_reference_requests: int = Field(default=200, ge=2, description="Sequences of an adapter version that "
                                          "form its reference window (its first ones, until a window is pinned).")
    drift_window_requests: int = Field(default=200, ge=2, description="Latest sequences compared with the "
                                       "reference.")
    drift_threshold: float = Field(default=0.2, gt=0, description="PSI at or above which a feature counts as "
                                   "drifted (0.1: a small shift, 0.25: a large one, by the usual rule of thumb).")
    drift_bins: int = Field(default=10, ge=2, description="Quantile bins of numeric features.")
    drift_top_tokens: int = Field(default=20, ge=1, description="Most frequent reference output tokens that get "
                                  "their own bin; the rest share one.")
    drift_max_versions: int = Field(default=100, ge=1, description="Adapter versions watched; later ones are not.")
    drift_path: str | None = Field(default=None, description="SQLite file keeping the drift windows across "
                                   "restarts (default: drift.sqlite beside the usage ledger's SQLite file, or under "
                                   "$LORAPLEX_HOME with a PostgreSQL ledger).")


DEFAULT_DRIFT = DriftConfig()


# ---------------------------------------------------------------- pure functions


def psi(reference: Sequence[int], current: Sequence[int], floor: float = PSI_FLOOR) -> float:
    """PSI of two histograms over the same bins (counts)."""
    if len(reference) != len(current):
        raise ValueError("histograms must have the same bins")
    ref_total, cur_total = sum(reference), sum(current)
    if not ref_total or not cur_total:
        raise ValueError("histograms must not be empty")
    total = 0.0
    for r, c in zip(reference, current):
        p, q = max(r / ref_total, floor), max(c / cur_total, floor)
        total += (q - p) * math.log(q / p)
    return total


def quantile_edges(values: Sequence[float], bins: int) -> list[float]:
    """Distinct upper edges splitting sorted `values` into `bins` near-equal groups; bin i holds the values
    in (edge[i-1], edge[i]], the last bin everything above the last edge."""
    ordered = sorted(values)
    edges = [ordered[min(len(ordered) - 1, math.ceil(len(ordered) * i / bins) - 1)] for i in range(1, bins)]
    return sorted(set(edges)) or [ordered[-1]]


def bin_counts(values: Sequence[float], edges: Sequence[float]) -> list[int]:
    counts = [0] * (len(edges) + 1)
    for v in values:
        counts[bisect.bisect_left(edges, v)] += 1
    return counts


def numeric_psi(reference: Sequence[float], current: Sequence[float], bins: int) -> float | None:
    if not reference or not current:
        return None
    edges = quantile_edges(reference, bins)
    return psi(bin_counts(reference, edges), bin_counts(current, edges))


def categorical_psi(reference: Counter, current: Counter, top: int | None = None) -> float | None:
    """`top`: only the reference's `top` most common values get a bin; every other value (and any value the
    reference never saw) falls into one shared bin."""
    if not reference or not current:
        return None
    keys = [k for k, _ in reference.most_common(top)]
    kept = set(keys)

    def histogram(counts: Counter) -> list[int]:
        return [counts[k] for k in keys] + [sum(n for k, n in counts.items() if k not in kept)]

    return psi(histogram(reference), histogram(current))


# ---------------------------------------------------------------- samples and windows


@dataclass(frozen=True)
class DriftSample:
    """One finished sequence of one adapter version."""

    prompt_tokens: int
    output_tokens: int
    mean_logprob: float | None
    finish_reason: str
    output_token_ids: tuple[int, ...]


def feature_psi(reference: Sequence[DriftSample], current: Sequence[DriftSample],
                config: DriftConfig) -> dict[str, float]:
    """PSI of every feature both windows have values for."""
    out: dict[str, float | None] = {
        "prompt_tokens": numeric_psi([s.prompt_tokens for s in reference], [s.prompt_tokens for s in current],
                                     config.drift_bins),
        "output_tokens": numeric_psi([s.output_tokens for s in reference], [s.output_tokens for s in current],
                                     config.drift_bins),
        "mean_logprob": numeric_psi([s.mean_logprob for s in reference if s.mean_logprob is not None],
                                    [s.mean_logprob for s in current if s.mean_logprob is not None],
                                    config.drift_bins),
        "finish_reason": categorical_psi(Counter(s.finish_reason for s in reference),
                                         Counter(s.finish_reason for s in current)),
        "output_token": categorical_psi(_tokens(reference), _tokens(current), config.drift_top_tokens),
    }
    return {k: v for k, v in out.items() if v is not None}


def _tokens(samples: Sequence[DriftSample]) -> Counter[Hashable]:
    counts: Counter[Hashable] = Counter()
    for s in samples:
        counts.update(s.output_token_ids)
    return counts


@dataclass
class VersionWindows:
    reference: list[DriftSample] = field(default_factory=list)
    current: deque[DriftSample] = field(default_factory=deque)
    pinned: bool = False


@dataclass(frozen=True)
class WindowState:
    """A version's windows as saved and restored (`drift_store.py`)."""

    reference: list[DriftSample]
    current: list[DriftSample]
    pinned: bool


@dataclass(frozen=True)
class VersionDrift:
    model: str
    version: str
    reference: int
    current: int
    pinned: bool
    psi: dict[str, float]
    drifted: list[str]  # features at or above the threshold


class DriftMonitor:
    """Windows per adapter version (`model`, `version`), fed by finished sequences; thread-safe."""

    def __init__(self, config: DriftConfig = DEFAULT_DRIFT):
        self.config = config
        self._lock = threading.Lock()
        self._versions: dict[tuple[str, str], VersionWindows] = {}
        self.changes = 0  # recorded samples and pins since start: whoever saves compares it with its last

    def export(self) -> dict[tuple[str, str], WindowState]:
        with self._lock:
            return {key: WindowState(list(w.reference), list(w.current), w.pinned) for key, w in self._versions.items()}

    def restore(self, states: dict[tuple[str, str], WindowState]) -> None:
        """Windows saved by an earlier run; a smaller window setting keeps the latest samples of each."""
        with self._lock:
            for key, state in list(states.items())[:self.config.drift_max_versions]:
                window = self.config.drift_window_requests
                self._versions[key] = VersionWindows(
                    reference=state.reference if state.pinned else state.reference[:self.config.drift_reference_requests],
                    current=deque(state.current[-window:], maxlen=window), pinned=state.pinned)

    def record(self, model: str, version: str, sample: DriftSample) -> None:
        key = (model, version)
        with self._lock:
            self.changes += 1
            windows = self._versions.get(key)
            if windows is None:
                if len(self._versions) >= self.config.drift_max_versions:
                    return
                windows = self._versions[key] = VersionWindows(
                    current=deque(maxlen=self.config.drift_window_requests))
            if len(windows.reference) < self.config.drift_reference_requests and not windows.pinned:
                windows.reference.append(sample)
            else:
                windows.current.append(sample)

    def pin(self, model: str, version: str) -> int:
        """Makes the current window the version's reference (and starts a new current window); returns its
        size. Raises KeyError for a version with no current window yet."""
        with self._lock:
            windows = self._versions.get((model, version))
            if windows is None or not windows.current:
                raise KeyError((model, version))
            windows.reference = list(windows.current)
            windows.current.clear()
            windows.pinned = True
            self.changes += 1
            return len(windows.reference)

    def report(self) -> list[VersionDrift]:
        with self._lock:
            items = [(key, list(w.reference), list(w.current), w.pinned) for key, w in self._versions.items()]
        out = []
        for (model, version), reference, current, pinned in sorted(items):
            ready = len(current) >= self.config.drift_window_requests and reference
            values = feature_psi(reference, current, self.config) if ready else {}
            out.append(VersionDrift(model, version, len(reference), len(current), pinned, values,
                                    [f for f, v in values.items() if v >= self.config.drift_threshold]))
        return out

    def snapshot(self) -> dict:
        """The dashboard's drift panel."""
        return {"threshold": self.config.drift_threshold, "window": self.config.drift_window_requests,
                "versions": [{"model": d.model, "version": d.version, "reference": d.reference,
                              "current": d.current, "pinned": d.pinned, "psi": d.psi, "drifted": d.drifted}
                             for d in self.report()]}


class DriftCollector:
    """`loraplex_drift_psi{model,version,feature}`, `loraplex_drift_detected{model,version,feature}` (1 at or
    above the threshold) and `loraplex_drift_threshold`, computed when /metrics is read."""

    def __init__(self, monitor: DriftMonitor):
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        labels = ("model", "version", "feature")
        values = GaugeMetricFamily("loraplex_drift_psi", "Population stability index of a feature, current "
                                   "window against the reference window.", labels=labels)
        detected = GaugeMetricFamily("loraplex_drift_detected", "1 when the feature's PSI is at or above "
                                     "loraplex_drift_threshold.", labels=labels)
        for d in self.monitor.report():
            for feature, value in d.psi.items():
                values.add_metric([d.model, d.version, feature], value)
                detected.add_metric([d.model, d.version, feature], float(feature in d.drifted))
        yield values
        yield detected
        yield GaugeMetricFamily("loraplex_drift_threshold", "PSI at which a feature counts as drifted.",
                                value=self.monitor.config.drift_threshold)


# ---------------------------------------------------------------- watching a response's deltas


@dataclass
class _Sequence:
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


async def watched(deltas: AsyncIterator[ChoiceDelta], monitor: DriftMonitor, model: str, version: str,
                  prompt_tokens: Sequence[tuple[int, int]]) -> AsyncIterator[ChoiceDelta]:
    """Passes `deltas` through; when they run to their end, records each finished sequence. `prompt_tokens`:
    (first choice index, prompt length) of each engine call, in order of first choice index."""
    sequences: dict[int, _Sequence] = {}
    async for delta in deltas:
        s = sequences.setdefault(delta.index, _Sequence())
        s.output_token_ids.extend(delta.token_ids)
        s.logprobs.extend(p.chosen.logprob for p in delta.logprobs or ())
        s.finish_reason = delta.finish_reason or s.finish_reason
        yield delta
    starts = [start for start, _ in prompt_tokens]
    for index, s in sorted(sequences.items()):
        if s.finish_reason is None:
            continue
        prompt = prompt_tokens[max(0, bisect.bisect_right(starts, index) - 1)][1]
        mean = sum(s.logprobs) / len(s.logprobs) if s.logprobs and len(s.logprobs) == len(s.output_token_ids) else None
        monitor.record(model, version, DriftSample(prompt, len(s.output_token_ids), mean, s.finish_reason,
                                                   tuple(s.output_token_ids)))
