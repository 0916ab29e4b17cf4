import asyncio
import math
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from api.observability.drift import (
    DriftCollector,
    DriftConfig,
    DriftMonitor,
    DriftSample,
    bin_counts,
    categorical_psi,
    feature_psi,
    numeric_psi,
    psi,
    quantile_edges,
    watched,
)
from engine.types import ChoiceDelta, PositionLogprobs, TokenLogprob


@pytest.mark.parametrize("reference, current, expected", [
    ([10, 10], [10, 10], 0.0),
    ([50, 50], [5, 5], 0.0),  # proportions, not counts
    ([1, 1], [3, 1], (0.75 - 0.5) * math.log(0.75 / 0.5) + (0.25 - 0.5) * math.log(0.25 / 0.5)),
    ([1, 0], [0, 1], 2 * (1 - 1e-4) * math.log(1 / 1e-4)),  # empty bins floored
])
def test_psi(reference, current, expected):
    assert psi(reference, current) == pytest.approx(expected)


@pytest.mark.parametrize("reference, current", [([1], [1, 2]), ([0, 0], [1, 1]), ([1, 1], [0, 0])])
def test_psi_refuses(reference, current):
    with pytest.raises(ValueError):
        psi(reference, current)


@pytest.mark.parametrize("values, bins, edges", [
    ([1, 2, 3, 4], 2, [2]),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 5, [2, 4, 6, 8]),
    ([5, 5, 5], 4, [5]),  # one distinct value: one edge
    ([3, 1, 2], 10, [1, 2, 3]),
])
def test_quantile_edges(values, bins, edges):
    assert quantile_edges(values, bins) == edges


@pytest.mark.parametrize("values, edges, counts", [
    ([1, 2, 3, 4], [2], [2, 2]),
    ([2, 2, 9], [2, 5], [2, 0, 1]),  # a value on an edge belongs to the bin it closes
    ([], [1], [0, 0]),
])
def test_bin_counts(values, edges, counts):
    assert bin_counts(values, edges) == counts


def test_numeric_psi_sees_a_shift_and_not_a_resample():
    reference = [10, 11, 12, 13, 14] * 4
    assert numeric_psi(reference, list(reversed(reference)), bins=5) == 0.0
    assert numeric_psi(reference, [40, 41, 42, 43, 44] * 4, bins=5) > 5
    assert numeric_psi([], [1], bins=5) is None


P = 1e-4  # the floor of an empty bin
# a and b at 1/2 each against none (floored); c, unseen by the reference, in "other": 1 against none (floored)
DISJOINT = 2 * (P - 0.5) * math.log(P / 0.5) + (1 - P) * math.log(1 / P)


@pytest.mark.parametrize("reference, current, top, expected", [
    ({"stop": 5, "length": 5}, {"length": 5, "stop": 5}, None, 0.0),
    ({"a": 2, "b": 2}, {"c": 4}, None, DISJOINT),
    ({"a": 3, "b": 1, "c": 1}, {"a": 3, "c": 2}, 1, 0.0),  # b and c share the "other" bin
])
def test_categorical_psi(reference, current, top, expected):
    assert categorical_psi(Counter(reference), Counter(current), top) == pytest.approx(expected)


def sample(prompt: int, output: int = 4, mean: float | None = -1.0, finish: str = "length") -> DriftSample:
    return DriftSample(prompt, output, mean, finish, tuple(range(output)))


CONFIG = DriftConfig(drift_reference_requests=4, drift_window_requests=4, drift_threshold=0.2, drift_bins=4)


def test_features_without_values_are_left_out():
    values = feature_psi([sample(5, mean=None)] * 4, [sample(5, mean=None)] * 4, CONFIG)
    assert values == {"prompt_tokens": 0.0, "output_tokens": 0.0, "finish_reason": 0.0, "output_token": 0.0}


def test_monitor_reference_then_window_then_drift():
    monitor = DriftMonitor(CONFIG)
    for prompt in (5, 6, 7, 8):
        monitor.record("m", "1", sample(prompt))
    for prompt in (5, 6, 7):
        monitor.record("m", "1", sample(prompt))
    [report] = monitor.report()
    assert (report.reference, report.current, report.psi) == (4, 3, {})  # the window is not full yet
    monitor.record("m", "1", sample(8))
    [report] = monitor.report()
    assert report.psi["prompt_tokens"] == 0.0 and report.drifted == []
    for prompt in (50, 60, 70, 80):
        monitor.record("m", "1", sample(prompt, finish="stop"))
    [report] = monitor.report()
    assert report.reference == 4 and report.current == 4
    assert report.drifted == ["prompt_tokens", "finish_reason"]


def test_pin_makes_the_window_the_reference():
    monitor = DriftMonitor(CONFIG)
    for prompt in (5, 5, 5, 5, 50, 50, 50, 50):
        monitor.record("m", "1", sample(prompt))
    assert monitor.report()[0].drifted == ["prompt_tokens"]
    assert monitor.pin("m", "1") == 4
    for _ in range(4):
        monitor.record("m", "1", sample(50))
    report = monitor.report()[0]
    assert report.pinned and report.drifted == [] and report.psi["prompt_tokens"] == 0.0
    with pytest.raises(KeyError):
        monitor.pin("m", "2")


def test_versions_are_apart_and_bounded():
    monitor = DriftMonitor(DriftConfig(drift_reference_requests=2, drift_window_requests=2, drift_max_versions=2))
    for version in ("1", "2", "3"):
        monitor.record("m", version, sample(5))
    assert [(d.version, d.reference) for d in monitor.report()] == [("1", 1), ("2", 1)]


def test_collector_exports_psi_and_flags():
    monitor = DriftMonitor(CONFIG)
    for prompt in (5, 5, 5, 5, 50, 50, 50, 50):
        monitor.record("poet", "2", sample(prompt))
    registry = CollectorRegistry()
    registry.register(DriftCollector(monitor))
    text = generate_latest(registry).decode()
    assert 'loraplex_drift_detected{feature="prompt_tokens",model="poet",version="2"} 1.0' in text
    assert 'loraplex_drift_detected{feature="output_tokens",model="poet",version="2"} 0.0' in text
    assert 'loraplex_drift_psi{feature="output_tokens",model="poet",version="2"} 0.0' in text
    assert "loraplex_drift_threshold 0.2" in text


def delta(index, token, logprob=None, finish=None):
    logprobs = None if logprob is None else (PositionLogprobs(TokenLogprob(token, "t", logprob), ()),)
    return ChoiceDelta(index=index, text="t", token_ids=(token,), logprobs=logprobs, finish_reason=finish)


async def _drain(iterator):
    return [d async for d in iterator]


def test_watched_records_each_finished_sequence():
    async def deltas():
        yield delta(0, 7, -1.0)
        yield delta(2, 9)
        yield delta(0, 8, -3.0, "stop")
        yield delta(2, 9, finish="length")
        yield delta(1, 4)  # never finished: not recorded

    monitor = DriftMonitor(DriftConfig(drift_reference_requests=10, drift_window_requests=2))
    out = asyncio.run(_drain(watched(deltas(), monitor, "m", "1", [(0, 11), (2, 22)])))
    assert len(out) == 5
    reference = monitor._versions[("m", "1")].reference
    assert reference == [DriftSample(11, 2, -2.0, "stop", (7, 8)), DriftSample(22, 2, None, "length", (9, 9))]


def test_watched_records_nothing_when_cut():
    async def deltas():
        yield delta(0, 7, finish="stop")
        raise RuntimeError("engine died")

    monitor = DriftMonitor()
    with pytest.raises(RuntimeError):
        asyncio.run(_drain(watched(deltas(), monitor, "m", "1", [(0, 3)])))
    assert monitor.report() == []
