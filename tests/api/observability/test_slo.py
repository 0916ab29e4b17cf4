from __future__ import annotations

import pytest

from api.observability.slo import (
    DEFAULT_SLO,
    LatencyTarget,
    SloTargets,
    SloWindowTracker,
    attainment,
    burn_rate,
    error_budget_remaining,
    percentile,
)


@pytest.mark.parametrize("samples, threshold, expected", [
    ([], 1.0, 1.0),
    ([0.1, 0.2], 0.15, 0.5),
    ([0.1, 0.2], 0.2, 1.0),  # at the threshold meets it
    ([0.3], 0.2, 0.0),
    ([0.1, 0.2, 0.3, 0.4], 0.35, 0.75),
])
def test_attainment(samples, threshold, expected):
    assert attainment(samples, threshold) == pytest.approx(expected)


TEN = [float(v) for v in range(10, 0, -1)]  # 10..1, unsorted on purpose


@pytest.mark.parametrize("samples, p, expected", [
    ([], 50, None),
    ([5.0], 99, 5.0),
    (TEN, 0, 1.0),
    (TEN, 10, 1.0),
    (TEN, 11, 2.0),
    (TEN, 50, 5.0),
    (TEN, 90, 9.0),
    (TEN, 95, 10.0),
    (TEN, 100, 10.0),
    ([float(v) for v in range(1, 21)], 95, 19.0),
    ([float(v) for v in range(1, 101)], 99, 99.0),
])
def test_percentile_nearest_rank(samples, p, expected):
    assert percentile(samples, p) == expected


@pytest.mark.parametrize("p", [-1, 100.5])
def test_percentile_rejects_out_of_range(p):
    with pytest.raises(ValueError):
        percentile([1.0], p)


@pytest.mark.parametrize("good, total, target, expected", [
    (0, 0, 99.0, 1.0),  # no traffic: untouched
    (100, 100, 99.0, 1.0),
    (995, 1000, 99.0, 0.5),
    (99, 100, 99.0, 0.0),
    (98, 100, 99.0, -1.0),
    (90, 100, 90.0, 0.0),
    (0, 10, 50.0, -1.0),
])
def test_error_budget_remaining(good, total, target, expected):
    assert error_budget_remaining(good, total, target) == pytest.approx(expected)


@pytest.mark.parametrize("good, total, target, expected", [
    (0, 0, 99.0, 0.0),  # no traffic: nothing burns
    (100, 100, 99.0, 0.0),
    (99, 100, 99.0, 1.0),
    (90, 100, 99.0, 10.0),
    (95, 100, 95.0, 1.0),
    (995, 1000, 99.9, 5.0),
])
def test_burn_rate(good, total, target, expected):
    assert burn_rate(good, total, target) == pytest.approx(expected)


STRICT = SloTargets(ttft=LatencyTarget(seconds=0.5, percentile=90.0), tpot=None,
                    e2e=LatencyTarget(seconds=2.0, percentile=90.0), availability=90.0)
LOOSE = SloTargets(ttft=LatencyTarget(seconds=1.0, percentile=80.0), tpot=None, e2e=None, availability=80.0)


def record(tracker, tenant="acme", mv="base", ttft=0.1, tpot=0.01, e2e=1.0, success=True):
    tracker.record(tenant, mv, ttft=ttft, tpot=tpot, e2e=e2e, success=success)


def test_tracker_counts_objectives_per_window(clock):
    tracker = SloWindowTracker(lambda tenant: STRICT, clock=clock)
    for _ in range(6):  # an hour-old burst: 1h window only
        record(tracker, ttft=0.9, e2e=3.0, success=False)
    clock.advance(3000)
    for ttft in (0.1, 0.2, 0.3, 0.6):
        record(tracker, ttft=ttft)
    [(key, windows)] = tracker.summaries().items()
    assert key == ("acme", "base")
    five, hour = windows["5m"], windows["1h"]
    assert (five.requests, five.errors, hour.requests, hour.errors) == (4, 0, 10, 6)
    ttft5 = five.objectives["ttft"]
    assert (ttft5.good, ttft5.total, ttft5.threshold_s, ttft5.target_percent) == (3, 4, 0.5, 90.0)
    assert ttft5.attainment == pytest.approx(0.75)
    assert ttft5.budget_remaining == pytest.approx(error_budget_remaining(3, 4, 90.0))
    assert ttft5.burn_rate == pytest.approx(2.5)
    assert ttft5.met is False
    ttft1 = hour.objectives["ttft"]
    assert (ttft1.good, ttft1.total) == (3, 10)
    avail1 = hour.objectives["availability"]
    assert (avail1.good, avail1.total, avail1.threshold_s) == (4, 10, None)
    assert avail1.burn_rate == pytest.approx(6.0)
    assert five.objectives["availability"].met is True
    assert "tpot" not in five.objectives  # the tenant has no tpot target
    assert five.latency["ttft"].p50 == 0.2 and five.latency["ttft"].p99 == 0.6
    assert hour.latency["e2e"].p95 == 3.0


def test_tracker_skips_missing_values(clock):
    tracker = SloWindowTracker(lambda tenant: STRICT, clock=clock)
    record(tracker, ttft=None, tpot=None, e2e=1.0)
    record(tracker, ttft=0.1, tpot=None, e2e=5.0)
    windows = tracker.summaries()[("acme", "base")]
    ttft = windows["5m"].objectives["ttft"]
    assert (ttft.good, ttft.total) == (1, 1)
    e2e = windows["5m"].objectives["e2e"]
    assert (e2e.good, e2e.total) == (1, 2)
    assert windows["5m"].latency["tpot"].p50 is None


@pytest.mark.parametrize("age, in_5m, in_1h", [
    (0, True, True),
    (300, True, True),  # a window includes its edge
    (300.5, False, True),
    (3600, False, True),
    (3600.5, False, False),
])
def test_tracker_window_edges(clock, age, in_5m, in_1h):
    tracker = SloWindowTracker(lambda tenant: DEFAULT_SLO, clock=clock)
    record(tracker)
    clock.advance(age)
    windows = tracker.summaries().get(("acme", "base"))
    if not in_1h:
        assert windows is None  # the key is pruned once empty
        return
    assert windows["5m"].requests == int(in_5m)
    assert windows["1h"].requests == 1


def test_tracker_caps_samples_per_key(clock):
    tracker = SloWindowTracker(lambda tenant: DEFAULT_SLO, clock=clock, max_samples_per_key=3)
    for i in range(5):
        record(tracker, ttft=float(i))
        record(tracker, mv="other-model")
    windows = tracker.summaries()
    assert windows[("acme", "base")]["1h"].requests == 3
    assert windows[("acme", "base")]["1h"].latency["ttft"].p50 == 3.0  # oldest (0, 1) dropped first
    assert windows[("acme", "other-model")]["1h"].requests == 3


def test_tracker_group_judges_each_request_by_its_tenant(clock):
    slos = {"strict": STRICT, "loose": LOOSE}
    tracker = SloWindowTracker(slos.__getitem__, clock=clock)
    record(tracker, tenant="strict", mv="m@1", ttft=0.8)  # missed (0.5)
    record(tracker, tenant="loose", mv="m@1", ttft=0.8)  # met (1.0)
    record(tracker, tenant="loose", mv="m@1", ttft=0.9)  # met
    record(tracker, tenant="loose", mv="m@2", ttft=5.0)  # other group
    by_model = tracker.summaries(lambda tenant, mv: mv)
    ttft = by_model["m@1"]["5m"].objectives["ttft"]
    assert (ttft.good, ttft.total) == (2, 3)
    assert ttft.threshold_s is None  # tenants disagree
    assert ttft.target_percent == pytest.approx((90 + 80 + 80) / 3)
    assert "e2e" in by_model["m@1"]["5m"].objectives  # strict tracks it
    assert "e2e" not in by_model["m@2"]["5m"].objectives  # loose alone does not
    by_tenant = tracker.summaries(lambda tenant, mv: tenant)
    assert by_tenant["loose"]["1h"].requests == 3
    assert by_tenant["loose"]["1h"].objectives["ttft"].threshold_s == 1.0


def test_tracker_summaries_without_latency(clock):
    tracker = SloWindowTracker(lambda tenant: DEFAULT_SLO, clock=clock)
    record(tracker)
    summary = tracker.summaries(latency=False)[("acme", "base")]["5m"]
    assert summary.latency == {}
    assert summary.objectives["ttft"].total == 1
