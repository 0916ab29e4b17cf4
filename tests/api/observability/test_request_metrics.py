from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from api.observability.request_metrics import AdmissionCounts, EngineGauges, Metrics
from api.observability.slo import LatencyTarget, SloTargets, SloWindowTracker

# Binary-exact seconds so met/missed at a threshold is not decided by rounding.
SLO = SloTargets(ttft=LatencyTarget(seconds=0.5, percentile=90.0), tpot=LatencyTarget(seconds=0.25, percentile=90.0),
                 e2e=LatencyTarget(seconds=2.0, percentile=90.0), availability=99.0)


def make_metrics(top_n: int = 10, clock=None) -> Metrics:
    tracker = SloWindowTracker(lambda tenant: SLO, clock=clock) if clock else None
    return Metrics(CollectorRegistry(), top_n, lambda tenant: SLO, tracker=tracker)


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def label_sets(metrics: Metrics, sample_name: str) -> set[tuple[tuple[str, str], ...]]:
    return {tuple(sorted(s.labels.items())) for family in metrics.registry.collect()
            for s in family.samples if s.name == sample_name}


ACME = {"tenant": "acme", "model": "base", "version": ""}
ACME_SUPPORT = {"tenant": "acme", "model": "support", "version": "3"}
BETA_SUPPORT = {"tenant": "beta", "model": "support", "version": "3"}


@pytest.fixture
def traffic(outcome):
    return [
        # tpot (0.75-0.25)/4 = 0.125 met; ttft met; e2e met
        outcome(ttft_seconds=0.25, e2e_seconds=0.75, inter_token_seconds=(0.125,) * 4),
        # one token: no tpot; ttft missed
        outcome(prompt_tokens=20, completion_tokens=1, ttft_seconds=0.75, e2e_seconds=0.75, inter_token_seconds=()),
        # server error: only availability judged (missed)
        outcome(model="support", version="3", status=500, prompt_tokens=7, completion_tokens=0, ttft_seconds=None,
                e2e_seconds=0.5, inter_token_seconds=()),
        # client went away: latency not judged, availability met
        outcome(tenant="beta", model="support", version="3", status=499, prompt_tokens=3, completion_tokens=2,
                ttft_seconds=0.25, e2e_seconds=3.0, inter_token_seconds=(0.5,)),
        # tpot (2.125-0.125)/2 = 1.0 missed, e2e missed, ttft met
        outcome(tenant="beta", model="support", version="3", prompt_tokens=4, completion_tokens=3, ttft_seconds=0.125,
                e2e_seconds=2.125, inter_token_seconds=(1.0, 1.0), cost_usd=0.004, price_usd=0.01),
    ]


def test_request_counts_and_label_sets(traffic):
    metrics = make_metrics()
    for o in traffic:
        metrics.observe(o)
    assert value(metrics, "loraplex_requests_total", **ACME, status="200") == 2
    assert value(metrics, "loraplex_requests_total", **ACME_SUPPORT, status="500") == 1
    assert value(metrics, "loraplex_requests_total", **BETA_SUPPORT, status="499") == 1
    assert value(metrics, "loraplex_requests_total", **BETA_SUPPORT, status="200") == 1
    assert label_sets(metrics, "loraplex_requests_total") == {
        tuple(sorted({**ACME, "status": "200"}.items())),
        tuple(sorted({**ACME_SUPPORT, "status": "500"}.items())),
        tuple(sorted({**BETA_SUPPORT, "status": "499"}.items())),
        tuple(sorted({**BETA_SUPPORT, "status": "200"}.items())),
    }


def test_token_cost_and_price_sums(traffic):
    metrics = make_metrics()
    for o in traffic:
        metrics.observe(o)
    for labels, prompt, completion in ((ACME, 30, 6), (ACME_SUPPORT, 7, 0), (BETA_SUPPORT, 7, 5)):
        assert value(metrics, "loraplex_prompt_tokens_total", **labels) == prompt
        assert value(metrics, "loraplex_completion_tokens_total", **labels) == completion
    assert value(metrics, "loraplex_cost_usd_total", **ACME) == pytest.approx(0.002)
    assert value(metrics, "loraplex_price_usd_total", **BETA_SUPPORT) == pytest.approx(0.012)
    assert value(metrics, "loraplex_cost_per_1k_tokens_usd", **ACME) == pytest.approx(0.002 * 1000 / 36)
    assert value(metrics, "loraplex_price_per_1k_tokens_usd", **BETA_SUPPORT) == pytest.approx(0.012 * 1000 / 12)


def test_latency_histograms(traffic):
    metrics = make_metrics()
    for o in traffic:
        metrics.observe(o)
    assert value(metrics, "loraplex_time_to_first_token_seconds_count", **ACME) == 2
    assert value(metrics, "loraplex_time_to_first_token_seconds_sum", **ACME) == 1.0
    assert value(metrics, "loraplex_time_to_first_token_seconds_count", **ACME_SUPPORT) is None
    assert value(metrics, "loraplex_time_to_first_token_seconds_count", **BETA_SUPPORT) == 2
    assert value(metrics, "loraplex_time_per_output_token_seconds_count", **ACME) == 1
    assert value(metrics, "loraplex_time_per_output_token_seconds_sum", **ACME) == 0.125
    assert value(metrics, "loraplex_time_per_output_token_seconds_sum", **BETA_SUPPORT) == 2.75 + 1.0
    assert value(metrics, "loraplex_inter_token_latency_seconds_count", **ACME) == 4
    assert value(metrics, "loraplex_inter_token_latency_seconds_count", **BETA_SUPPORT) == 3
    assert value(metrics, "loraplex_inter_token_latency_seconds_bucket", **BETA_SUPPORT, le="0.5") == 1
    assert value(metrics, "loraplex_e2e_request_latency_seconds_count", **ACME_SUPPORT) == 1
    assert value(metrics, "loraplex_queue_time_seconds_count", **BETA_SUPPORT) == 2
    assert value(metrics, "loraplex_queue_time_seconds_sum", **ACME) == pytest.approx(0.02)


@pytest.mark.parametrize("labels, objective, met, missed", [
    (ACME, "ttft", 1, 1),
    (ACME, "tpot", 1, None),
    (ACME, "e2e", 2, None),
    (ACME, "availability", 2, None),
    (ACME_SUPPORT, "ttft", None, None),
    (ACME_SUPPORT, "availability", None, 1),
    (BETA_SUPPORT, "ttft", 1, None),
    (BETA_SUPPORT, "tpot", None, 1),
    (BETA_SUPPORT, "e2e", None, 1),
    (BETA_SUPPORT, "availability", 2, None),
])
def test_slo_met_and_missed(traffic, labels, objective, met, missed):
    metrics = make_metrics()
    for o in traffic:
        metrics.observe(o)
    name = "loraplex_slo_requests_total"
    assert value(metrics, name, **labels, objective=objective, result="met") == met
    assert value(metrics, name, **labels, objective=objective, result="missed") == missed


def test_tenant_cardinality_is_bounded(outcome):
    metrics = make_metrics(top_n=2)
    for i in range(5):
        metrics.observe(outcome(tenant=f"t{i}"))
    tenants = {dict(labels)["tenant"] for labels in label_sets(metrics, "loraplex_requests_total")}
    assert tenants == {"t0", "t1", "other"}
    assert value(metrics, "loraplex_requests_total", tenant="other", model="base", version="", status="200") == 3


def test_model_version_cardinality_is_bounded(outcome):
    metrics = make_metrics(top_n=1)
    metrics.observe(outcome(model="a", version="1"))
    metrics.observe(outcome(model="a", version="2"))
    metrics.observe(outcome(model="b", version=""))
    assert value(metrics, "loraplex_requests_total", tenant="acme", model="a", version="1", status="200") == 1
    assert value(metrics, "loraplex_requests_total", tenant="acme", model="other", version="", status="200") == 2


def test_rejected_requests(outcome):
    metrics = make_metrics(top_n=1)
    metrics.observe(outcome(tenant="acme"))
    metrics.observe_rejected(401)
    metrics.observe_rejected(404, tenant="beta")
    assert value(metrics, "loraplex_requests_total", tenant="unknown", model="unknown", version="",
                 status="401") == 1
    assert value(metrics, "loraplex_requests_total", tenant="other", model="unknown", version="",
                 status="404") == 1
    assert metrics.snapshot().tenants.keys() == {"acme"}  # refusals carry no tokens or latency


def test_slo_gauges_follow_the_windows(outcome, clock):
    metrics = make_metrics(clock=clock)
    for i in range(100):
        metrics.observe(outcome(ttft_seconds=1.0 if i < 20 else 0.25))  # 20% missed, 10% allowed
    budget = "loraplex_slo_error_budget_remaining_ratio"
    burn = "loraplex_slo_burn_rate"
    assert value(metrics, budget, tenant="acme", objective="ttft") == pytest.approx(-1.0)
    assert value(metrics, budget, tenant="acme", objective="availability") == pytest.approx(1.0)
    assert value(metrics, burn, tenant="acme", objective="ttft", window="5m") == pytest.approx(2.0)
    clock.advance(301)
    assert value(metrics, burn, tenant="acme", objective="ttft", window="5m") == 0.0
    assert value(metrics, burn, tenant="acme", objective="ttft", window="1h") == pytest.approx(2.0)
    clock.advance(3600)
    assert value(metrics, budget, tenant="acme", objective="ttft") is None  # nothing left in the window


def test_engine_and_admission_sources():
    metrics = make_metrics(top_n=1)
    assert value(metrics, "loraplex_engine_running_requests") is None  # no source yet
    metrics.set_engine_source(lambda: EngineGauges(running=3, waiting=4, kv_cache_usage=0.25, unfinished=9,
                                                         generation_tokens=77))
    metrics.set_admission_source(lambda: {"a": AdmissionCounts(1, 2), "b": AdmissionCounts(3, 4),
                                          "c": AdmissionCounts(5, 6)})
    assert value(metrics, "loraplex_engine_running_requests") == 3
    assert value(metrics, "loraplex_engine_waiting_requests") == 4
    assert value(metrics, "loraplex_engine_kv_cache_usage_ratio") == 0.25
    assert value(metrics, "loraplex_engine_unfinished_requests") == 9
    assert value(metrics, "loraplex_engine_generation_tokens_total") == 77
    assert value(metrics, "loraplex_admission_queued_requests", tenant="a") == 1
    assert value(metrics, "loraplex_admission_queued_requests", tenant="other") == 8
    assert value(metrics, "loraplex_admission_running_requests", tenant="other") == 10
    metrics.in_flight.inc()
    assert value(metrics, "loraplex_requests_in_flight") == 1


def test_snapshot_groups(traffic):
    metrics = make_metrics()
    for o in traffic:
        metrics.observe(o)
    snap = metrics.snapshot()
    assert snap.tenants.keys() == {"acme", "beta"}
    assert snap.models.keys() == {"base", "support@3"}
    acme = snap.tenants["acme"]
    assert (acme.totals.requests, acme.totals.errors, acme.totals.prompt_tokens) == (3, 1, 37)
    assert acme.windows["5m"].requests == 3
    support = snap.models["support@3"]
    assert (support.totals.requests, support.totals.completion_tokens) == (3, 5)
    assert support.windows["1h"].objectives["availability"].good == 2


def test_render_is_prometheus_text(outcome):
    metrics = make_metrics()
    metrics.observe(outcome())
    text = metrics.render().decode()
    assert 'loraplex_requests_total{model="base",status="200",tenant="acme",version=""} 1.0' in text
    assert "# TYPE loraplex_slo_burn_rate gauge" in text
