"""The dashboard history: buckets, rings, roll-up, histogram percentiles, groups, events and the JSON shape."""

from __future__ import annotations

import importlib.machinery
import json
import random
import threading

import pytest
from prometheus_client import CollectorRegistry

from api.observability import plotly_asset
from api.observability.dashboard import dashboard_snapshot
from api.observability.history import ALL, History
from api.observability.history_buckets import SloPoint, status_class
from api.observability.history_events import HistoryTierEvents
from api.observability.history_json import history_json, slo_points
from api.observability.labels import LabelBounder
from api.observability.latency_histogram import BOUNDS, RATIO, LatencyHistogram, bucket_of
from api.observability.plotly_asset import PlotlyMissingError, plotly_js_path
from api.observability.request_metrics import AdmissionCounts, Metrics
from api.observability.slo import LatencyTarget, SloTargets, percentile

T0 = 1_699_920_000.0  # midnight UTC (19675 days): 10 s and 1 min buckets start exactly here
SHAPE_KEYS = {"resolution", "interval_s", "group", "groups", "generated_at_unix", "started_at_unix", "retention", "t",
              "requests_per_s", "output_tokens_per_s", "ttft_s", "tpot_s", "objective_s", "budget_remaining",
              "queued", "running", "residency", "events"}


@pytest.fixture
def clock(clock):
    clock.now = T0
    return clock


def new_history(clock, top_n: int = 10, max_events: int = 100) -> History:
    return History(LabelBounder(top_n).bound, LabelBounder(top_n).bound, clock, max_events=max_events)


def at(data: dict, series: list, start: float):
    """The value of a series in the bucket starting at `start`."""
    return series[data["t"].index(start)]


# --- histogram ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("values, p, expected", [
    ([], 50, None),
    ([0.1], 50, 0.1),  # capped at the largest value seen
    ([0.1, 0.1, 0.1, 0.1], 99, 0.1),
    ([0.010, 0.020, 0.040, 0.080], 50, BOUNDS[bucket_of(0.020)]),  # rank 2 of 4: the second value's bucket bound
    ([0.010, 0.020, 0.040, 0.080], 75, BOUNDS[bucket_of(0.040)]),
    ([0.010, 0.020, 0.040, 0.080], 100, 0.080),
    ([0.0005], 50, 0.0005),  # under the first bound
    ([0.1, 400.0], 99, 400.0),  # overflow bucket: the max
    ([0.1] * 94 + [5.0] * 6, 95, 5.0),
    ([0.1] * 95 + [5.0] * 5, 95, BOUNDS[bucket_of(0.1)]),
])
def test_histogram_percentile(values, p, expected):
    h = LatencyHistogram()
    for v in values:
        h.add(bucket_of(v), v)
    assert h.percentile(p) == pytest.approx(expected) if expected is not None else h.percentile(p) is None


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("p", [50, 95, 99])
def test_histogram_estimate_within_one_bucket_above_exact(seed, p):
    rng = random.Random(seed)
    values = [rng.lognormvariate(-2.5, 1.2) for _ in range(rng.randint(1, 400))]
    h = LatencyHistogram()
    for v in values:
        h.add(bucket_of(v), v)
    exact = percentile(values, p)
    assert exact <= h.percentile(p) <= exact * RATIO * (1 + 1e-12)


def test_histogram_merge_equals_adding_everything():
    a, b, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    for i, v in enumerate([0.003, 0.2, 0.21, 1.5, 0.07, 90.0]):
        (a if i % 2 else b).add(bucket_of(v), v)
        both.add(bucket_of(v), v)
    a.merge(b)
    assert (a.counts, a.total, a.max_seen) == (both.counts, both.total, both.max_seen)


def test_histogram_rejects_out_of_range_percentile():
    with pytest.raises(ValueError, match="percentile"):
        LatencyHistogram().percentile(0)


# --- status classes and bucketing -----------------------------------------------------------------------------------

@pytest.mark.parametrize("status, expected", [
    (200, "2xx"), (201, "2xx"), (302, "2xx"), (400, "4xx"), (404, "4xx"), (429, "4xx"),
    (499, "499"), (500, "5xx"), (503, "5xx"),
])
def test_status_classes(status, expected, clock, outcome):
    history = new_history(clock)
    history.record(outcome(status=status))
    data = history_json(history, "10s", None, T0)
    rates = {cls: at(data, series, T0) for cls, series in data["requests_per_s"].items()}
    assert rates == {cls: (1.0 if cls == expected else 0.0) for cls in rates}  # 1 request over the 1 s covered
    assert ["2xx", "4xx", "5xx", "499"][status_class(status)] == expected


@pytest.mark.parametrize("offsets, expected", [  # seconds after T0 -> requests per 10 s bucket start offset
    ([0, 9.99], {0: 2}),
    ([0, 10], {0: 1, 10: 1}),
    ([5, 15, 25, 25.5], {0: 1, 10: 1, 20: 2}),
    ([59.9, 60], {50: 1, 60: 1}),
])
def test_requests_land_in_their_10s_bucket(offsets, expected, clock, outcome):
    history = new_history(clock)
    for offset in offsets:
        clock.now = T0 + offset
        history.record(outcome())
    now = T0 + 100
    data = history_json(history, "10s", None, now)
    counts = {int(t - T0): round(r * 10) for t, r in zip(data["t"], data["requests_per_s"]["2xx"]) if r}
    assert counts == expected


def test_rates_divide_by_the_seconds_a_bucket_covered(clock, outcome):
    clock.now = T0 + 5  # the history starts mid-bucket
    history = new_history(clock)
    for _ in range(10):
        history.record(outcome(completion_tokens=7))
    clock.now = T0 + 12
    history.record(outcome(completion_tokens=7))
    data = history_json(history, "10s", None, T0 + 14)
    assert at(data, data["requests_per_s"]["2xx"], T0) == 2.0  # 10 requests in the 5 s since start
    assert at(data, data["requests_per_s"]["2xx"], T0 + 10) == 0.25  # the current bucket: 1 in 4 s
    assert at(data, data["output_tokens_per_s"], T0) == 14.0
    assert at(data, data["requests_per_s"]["2xx"], T0 - 10) is None  # before the process started


def test_latency_counts_only_served_requests(clock, outcome):
    history = new_history(clock)
    history.record(outcome(status=200, ttft_seconds=0.2))
    history.record(outcome(status=500, ttft_seconds=9.0))
    history.record(outcome(status=429, ttft_seconds=8.0))
    data = history_json(history, "10s", None, T0)
    assert at(data, data["ttft_s"]["p99"], T0) == 0.2
    assert at(data, data["tpot_s"]["p99"], T0) == pytest.approx((0.6 - 0.2) / 4)


# --- rings ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("resolution, width, slots", [("10s", 10, 360), ("1m", 60, 1440)])
def test_window_is_the_last_slots_buckets(resolution, width, slots, clock):
    history = new_history(clock)
    now = T0 + 7 * 86400 + 123.4
    data = history_json(history, resolution, None, now)
    assert len(data["t"]) == slots
    assert data["t"][-1] == (now // width) * width
    assert all(b - a == width for a, b in zip(data["t"], data["t"][1:]))


@pytest.mark.parametrize("resolution, width, slots", [("10s", 10, 360), ("1m", 60, 1440)])
def test_ring_wraps_around(resolution, width, slots, clock, outcome):
    history = new_history(clock)
    for _ in range(3):
        history.record(outcome())

    def advance_to(t: float) -> None:  # as the server does, sampling as time goes by (here every 10 min)
        while clock.now + 600 < t:
            clock.advance(600)
            history.sample({}, {}, {})
        clock.now = t

    advance_to(T0 + width * (slots - 1))
    oldest = history_json(history, resolution, None, clock.now)
    assert oldest["t"][0] == T0 and oldest["requests_per_s"]["2xx"][0] == pytest.approx(3 / width)

    advance_to(T0 + width * slots)  # the first bucket's slot comes round again
    history.record(outcome())
    advance_to(T0 + width * (slots + 1))
    history.sample({}, {}, {})  # the wrapped bucket is final (and, for 1m, rolled up into the reused slot)
    wrapped = history_json(history, resolution, None, clock.now)
    assert T0 not in wrapped["t"]
    assert at(wrapped, wrapped["requests_per_s"]["2xx"], T0 + width * slots) == pytest.approx(1 / width)


@pytest.mark.parametrize("resolution, width, slots", [("10s", 10, 360), ("1m", 60, 1440)])
def test_slot_not_rewritten_since_its_last_lap_reads_as_empty(resolution, width, slots, clock, outcome):
    history = new_history(clock)
    history.record(outcome())
    clock.now = T0 + 600
    history.sample({}, {}, {})  # rolls minute 0 up into the 1 m ring
    now = T0 + width * (slots + 1)  # nothing written since: every slot of the window is a lap old or empty
    data = history_json(history, resolution, None, now)
    assert at(data, data["requests_per_s"]["2xx"], T0 + width * slots) == 0.0


def test_clock_stepping_back_writes_the_newest_bucket(clock, outcome):
    history = new_history(clock)
    clock.now = T0 + 35
    history.record(outcome())
    clock.now = T0 + 12  # NTP stepped the clock back
    history.record(outcome())
    data = history_json(history, "10s", None, T0 + 35)
    assert at(data, data["requests_per_s"]["2xx"], T0 + 30) == pytest.approx(2 / 5)  # 5 s covered so far
    assert at(data, data["requests_per_s"]["2xx"], T0 + 10) == 0.0


# --- roll-up --------------------------------------------------------------------------------------------------------

def test_minute_rolls_up_from_its_10s_buckets(clock, outcome):
    history = new_history(clock)
    ttfts = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6]
    for i, ttft in enumerate(ttfts):  # one request in each 10 s bucket of the first minute
        clock.now = T0 + 10 * i + 1
        history.record(outcome(ttft_seconds=ttft, completion_tokens=6))
        history.sample({"acme": AdmissionCounts(queued=i, running=1)}, {"cpu": i}, {})
    clock.now = T0 + 75
    history.sample({}, {}, {})  # the next minute: minute 0 is final and rolled up
    data = history_json(history, "1m", None, T0 + 75)
    assert at(data, data["requests_per_s"]["2xx"], T0) == pytest.approx(0.1)  # 6 in 60 s
    assert at(data, data["output_tokens_per_s"], T0) == pytest.approx(0.6)
    assert at(data, data["ttft_s"]["p50"], T0) == pytest.approx(BOUNDS[bucket_of(0.2)], rel=1e-5)  # rank 3 of 6
    assert at(data, data["ttft_s"]["p99"], T0) == 1.6
    assert at(data, data["queued"], T0) == 5  # the minute's last sample
    assert at(data, data["residency"]["cpu"], T0) == 5
    assert at(data, data["requests_per_s"]["2xx"], T0 + 60) == 0.0  # the current minute, built on the fly


def test_current_minute_is_merged_on_read(clock, outcome):
    history = new_history(clock)
    for offset in (1, 11, 21):
        clock.now = T0 + offset
        history.record(outcome())
    data = history_json(history, "1m", None, T0 + 30)
    assert at(data, data["requests_per_s"]["2xx"], T0) == pytest.approx(3 / 30)


@pytest.mark.parametrize("idle_minutes, kept", [(30, True), (59, True), (61, False)])
def test_rolled_minutes_outlive_the_10s_ring(idle_minutes, kept, clock, outcome):
    """Roll-up happens on sample and read; the 10 s ring covers 59 idle minutes before a minute is lost."""
    history = new_history(clock)
    history.record(outcome())
    clock.now = T0 + 60 * idle_minutes + 1
    history.sample({}, {}, {})  # first call since the request: rolls up what the 10 s ring still holds
    clock.now = T0 + 5 * 3600  # long after the 10 s ring wrapped
    data = history_json(history, "1m", None, clock.now)
    assert (at(data, data["requests_per_s"]["2xx"], T0) == pytest.approx(1 / 60)) is kept


def test_minute_held_only_in_part_is_dropped_not_rolled_up_short(clock, outcome):
    history = new_history(clock)
    for i in range(6):
        clock.now = T0 + 10 * i
        history.record(outcome())
    clock.now = T0 + 3600  # the first call in an hour: its bucket takes the slot of minute 0's first bucket
    history.sample({}, {}, {})
    data = history_json(history, "1m", None, clock.now)
    assert at(data, data["requests_per_s"]["2xx"], T0) == 0.0


def test_summarised_buckets_read_as_they_did_live(clock, outcome):
    """Rolled-up 10 s buckets keep only a summary: it must answer what the live histograms did."""
    history = new_history(clock)
    for i, (ttft, tokens, status) in enumerate([(0.05, 9, 200), (0.3, 1, 200), (2.0, 40, 503), (0.7, 5, 499)]):
        clock.now = T0 + 10 * i + 1
        for tenant in ("a", "b"):
            history.record(outcome(tenant=tenant, ttft_seconds=ttft, completion_tokens=tokens, status=status))
    live = {g: history_json(history, "10s", g, T0 + 55) for g in ("all", "tenant:a", "model:base")}
    clock.now = T0 + 65
    history.sample({}, {}, {})  # minute 0 rolls up: its 10 s buckets become summaries
    for group, before in live.items():
        after = history_json(history, "10s", group, T0 + 55)
        for key in ("requests_per_s", "output_tokens_per_s", "ttft_s", "tpot_s"):
            assert after[key] == before[key], (group, key)
    assert at(after, after["tpot_s"]["p50"], T0 + 10) is None  # one output token: no TPOT, before and after


def test_samples_and_summaries_share_their_group_maps(clock, outcome):
    history = new_history(clock)
    for step in range(3):
        history.record(outcome())
        history.sample({"acme": AdmissionCounts(step, 0)}, {}, {})
        clock.advance(60)
    history.sample({"acme": AdmissionCounts(7, 0), "beta": AdmissionCounts(1, 0)}, {}, {})  # a new group
    buckets = [history._fine.get(int(T0 // 10) + 6 * step) for step in range(4)]
    assert buckets[0].gauges.offsets is buckets[1].gauges.offsets is buckets[2].gauges.offsets
    assert buckets[3].gauges.offsets is not buckets[2].gauges.offsets
    assert buckets[0].groups.offsets is buckets[1].groups.offsets  # summaries of rolled-up minutes
    data = history_json(history, "1m", "tenant:acme", clock.now)
    assert [at(data, data["queued"], T0 + 60 * step) for step in range(4)] == [0, 1, 2, 7]


# --- groups ---------------------------------------------------------------------------------------------------------

def test_groups_come_from_the_bounding_functions(clock, outcome):
    history = new_history(clock, top_n=1)
    for tenant, model, version in [("a", "base", ""), ("b", "support", "3"), ("c", "sql", "1"), ("a", "base", "")]:
        history.record(outcome(tenant=tenant, model=model, version=version))
    data = history_json(history, "10s", None, T0)
    assert data["groups"] == ["all", "tenant:a", "tenant:other", "model:base", "model:other"]
    rate = {g: at(data, history_json(history, "10s", g, T0)["requests_per_s"]["2xx"], T0) for g in data["groups"]}
    assert rate == {"all": 4.0, "tenant:a": 2.0, "tenant:other": 2.0, "model:base": 2.0, "model:other": 2.0}


def test_groups_listed_only_while_in_the_window(clock, outcome):
    history = new_history(clock)
    history.record(outcome(tenant="old"))
    clock.now = T0 + 2 * 3600
    history.record(outcome(tenant="new"))
    assert history_json(history, "10s", None, clock.now)["groups"] == ["all", "tenant:new", "model:base"]
    assert history_json(history, "1m", None, clock.now)["groups"] == [
        "all", "tenant:new", "tenant:old", "model:base"]


def test_unknown_group_reads_as_no_traffic(clock, outcome):
    history = new_history(clock)
    history.record(outcome())
    data = history_json(history, "10s", "tenant:nobody", T0)
    assert data["group"] == "tenant:nobody"
    assert at(data, data["requests_per_s"]["2xx"], T0) == 0.0


def test_sample_bounds_tenants_and_sums_all(clock):
    history = new_history(clock, top_n=1)
    admission = {"a": AdmissionCounts(2, 1), "b": AdmissionCounts(3, 4), "c": AdmissionCounts(5, 0)}
    history.sample(admission, {"engine": 2, "cpu": 3}, {"all": {"ttft": SloPoint(0.5, 0.25)}})
    expect = {ALL: (10, 5), "tenant:a": (2, 1), "tenant:other": (8, 4), "model:base": (None, None)}
    for group, (queued, running) in expect.items():
        data = history_json(history, "10s", group, T0)
        assert (at(data, data["queued"], T0), at(data, data["running"], T0)) == (queued, running)
    data = history_json(history, "10s", None, T0)
    assert {tier: at(data, s, T0) for tier, s in data["residency"].items()} == {"engine": 2, "cpu": 3, "disk": 0}
    assert at(data, data["objective_s"]["ttft"], T0) == 0.5
    assert at(data, data["budget_remaining"]["ttft"], T0) == 0.25
    assert at(data, data["budget_remaining"]["availability"], T0) is None
    assert at(data, data["queued"], T0 - 10) is None  # no sample there


def test_concurrent_records_are_all_counted(clock, outcome):
    history = new_history(clock)
    start = threading.Barrier(8)

    def work():
        start.wait()
        for _ in range(500):
            history.record(outcome())

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = history_json(history, "10s", None, T0)
    assert at(data, data["requests_per_s"]["2xx"], T0) == 4000.0


# --- events ---------------------------------------------------------------------------------------------------------

def test_events_are_bounded_and_windowed(clock):
    history = new_history(clock, max_events=3)
    for i in range(5):
        clock.now = T0 + 1000 * i
        history.event("load", f"a@{i}", "cpu")
    data = history_json(history, "1m", None, clock.now)
    assert [e["adapter"] for e in data["events"]] == ["a@2", "a@3", "a@4"]
    assert data["events"][0] == {"t": T0 + 2000, "kind": "load", "adapter": "a@2", "tier": "cpu"}
    assert [e["adapter"] for e in history_json(history, "10s", None, clock.now)["events"]] == ["a@2", "a@3", "a@4"]
    assert history_json(history, "10s", None, clock.now + 3000)["events"][0]["adapter"] == "a@4"


@pytest.mark.parametrize("kind, tier, message", [("loaded", "cpu", "event kind"), ("load", "gpu", "tier")])
def test_event_rejects_unknown_values(kind, tier, message, clock):
    with pytest.raises(ValueError, match=message):
        new_history(clock).event(kind, "a@1", tier)


def test_rejects_non_positive_event_bound(clock):
    with pytest.raises(ValueError, match="max_events"):
        new_history(clock, max_events=0)


class RecordingEvents:
    def __init__(self):
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def test_tier_events_forward_and_note_transitions(clock):
    history, inner = new_history(clock), RecordingEvents()
    events = HistoryTierEvents(inner, history)
    events.cache_miss("a@1", "disk")
    events.observe_load("disk", 0.5)
    events.set_resident("a@1", "disk", True)
    events.set_resident("a@1", "disk", True)  # a disk hit re-asserts residency: not a second load
    events.set_resident("a@1", "cpu", True)
    events.evicted("a@1", "cpu")
    events.set_resident("a@1", "cpu", False)
    events.set_resident("a@1", "cpu", True)
    assert [c[0] for c in inner.calls] == ["cache_miss", "observe_load", "set_resident", "set_resident",
                                           "set_resident", "evicted", "set_resident", "set_resident"]
    noted = [(e["kind"], e["tier"]) for e in history_json(history, "10s", None, T0)["events"]]
    assert noted == [("load", "disk"), ("load", "cpu"), ("evict", "cpu"), ("load", "cpu")]


# --- JSON shape -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("resolution", ["10s", "1m"])
def test_json_shape(resolution, clock, outcome):
    history = new_history(clock)
    history.record(outcome(tenant="acme"))
    history.sample({"acme": AdmissionCounts(1, 1)}, {"engine": 1}, {"all": {"ttft": SloPoint(0.5, 1.0)}})
    history.event("evict", "a@1", "engine")
    data = json.loads(json.dumps(history_json(history, resolution, "tenant:acme", T0 + 1), allow_nan=False))
    assert set(data) == SHAPE_KEYS
    assert (data["resolution"], data["interval_s"], data["group"]) == (resolution, {"10s": 10, "1m": 60}[resolution],
                                                                       "tenant:acme")
    assert data["started_at_unix"] == T0 and data["generated_at_unix"] == T0 + 1
    assert "restart" in data["retention"]
    assert set(data["requests_per_s"]) == {"2xx", "4xx", "5xx", "499"}
    assert set(data["ttft_s"]) == set(data["tpot_s"]) == {"p50", "p95", "p99"}
    assert set(data["objective_s"]) == {"ttft", "tpot"}
    assert set(data["budget_remaining"]) == {"ttft", "tpot", "e2e", "availability"}
    assert set(data["residency"]) == {"engine", "cpu", "disk"}
    series = [data["output_tokens_per_s"], data["queued"], data["running"]]
    for key in ("requests_per_s", "ttft_s", "tpot_s", "objective_s", "budget_remaining", "residency"):
        series.extend(data[key].values())
    assert all(len(s) == len(data["t"]) for s in series)
    assert data["events"] == [{"t": T0, "kind": "evict", "adapter": "a@1", "tier": "engine"}]


def test_unknown_resolution_is_an_error(clock):
    with pytest.raises(ValueError, match="resolution"):
        history_json(new_history(clock), "5m", None, T0)


# --- SLO points from the dashboard snapshot -------------------------------------------------------------------------

def test_slo_points_per_group_and_worst_tenant_for_all(outcome):
    slos = {"acme": SloTargets(ttft=LatencyTarget(seconds=0.5, percentile=50.0), availability=50.0),
            "beta": SloTargets(ttft=LatencyTarget(seconds=0.25, percentile=50.0), availability=50.0)}
    metrics = Metrics(CollectorRegistry(), 10, slos.__getitem__)
    metrics.observe(outcome(tenant="acme", ttft_seconds=0.1))
    metrics.observe(outcome(tenant="acme", ttft_seconds=0.9))  # 1 of 2 missed a 50% objective: budget spent
    metrics.observe(outcome(tenant="beta", model="support", version="3", ttft_seconds=0.1))
    points = slo_points(dashboard_snapshot(metrics, {}, now=T0))
    assert set(points) == {"all", "tenant:acme", "tenant:beta", "model:base", "model:support@3"}
    assert points["tenant:acme"]["ttft"] == SloPoint(0.5, 0.0)
    assert points["tenant:beta"]["ttft"] == SloPoint(0.25, 1.0)
    assert points["all"]["ttft"] == SloPoint(0.25, 0.0)  # strictest threshold, smallest budget left
    assert points["all"]["availability"] == SloPoint(None, 1.0)


# --- plotly.min.js --------------------------------------------------------------------------------------------------

def test_plotly_js_is_found_in_the_installed_package():
    path = plotly_js_path()
    assert path.name == "plotly.min.js" and path.parent.name == "package_data"
    assert b"plotly.js" in path.read_bytes()[:400]


def test_missing_plotly_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(plotly_asset.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PlotlyMissingError, match="not installed"):
        plotly_js_path()


def test_plotly_without_its_js_is_a_clear_error(monkeypatch, tmp_path):
    spec = importlib.machinery.ModuleSpec("plotly", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(plotly_asset.importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(PlotlyMissingError, match="has no package_data/plotly.min.js"):
        plotly_js_path()
