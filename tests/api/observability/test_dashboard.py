from __future__ import annotations

import json
import re

import pytest
from prometheus_client import CollectorRegistry

from api.observability.dashboard import DASHBOARD_HTML, dashboard_snapshot
from api.observability.request_metrics import Metrics
from api.observability.slo import LatencyTarget, SloTargets, SloWindowTracker

SLOS = {
    "acme": SloTargets(ttft=LatencyTarget(seconds=0.5, percentile=90.0), tpot=None,
                       e2e=LatencyTarget(seconds=2.0, percentile=90.0), availability=90.0),
    "beta": SloTargets(ttft=LatencyTarget(seconds=1.0, percentile=50.0), availability=50.0),
}


@pytest.fixture
def metrics(clock):
    return Metrics(CollectorRegistry(), 10, SLOS.__getitem__, tracker=SloWindowTracker(SLOS.__getitem__, clock))


def test_rows_per_tenant_and_model(metrics, outcome, clock):
    for ttft in (0.125, 0.25, 0.75):  # old traffic: in 1h only
        metrics.observe(outcome(ttft_seconds=ttft))
    clock.advance(600)
    metrics.observe(outcome(model="support", version="3", ttft_seconds=0.25))
    metrics.observe(outcome(tenant="beta", model="support", version="3", status=503, ttft_seconds=None))
    data = dashboard_snapshot(metrics, {"engine": ["support@3", "base-x"], "disk": ["z"]}, now=86400.0)
    json.dumps(data, allow_nan=False)  # JSON-able, no NaN or infinity

    assert data["generated_at"] == "1970-01-02T00:00:00+00:00"
    assert data["windows"] == ["5m", "1h"]
    assert data["residency"] == {"engine": ["base-x", "support@3"], "cpu": [], "disk": ["z"]}
    assert [row["name"] for row in data["tenants"]] == ["acme", "beta"]
    assert [row["name"] for row in data["models"]] == ["base", "support@3"]

    acme = data["tenants"][0]
    assert acme["requests"] == {"5m": 1, "1h": 4}
    assert acme["error_rate"] == {"5m": 0.0, "1h": 0.0}
    assert acme["latency"]["1h"]["ttft"] == {"p50": 0.25, "p95": 0.75, "p99": 0.75}
    assert acme["latency"]["5m"]["ttft"] == {"p50": 0.25, "p95": 0.25, "p99": 0.25}
    ttft = acme["objectives"]["ttft"]
    assert (ttft["threshold_s"], ttft["target_percent"]) == (0.5, 90.0)
    assert ttft["good"] == {"5m": 1, "1h": 3} and ttft["total"] == {"5m": 1, "1h": 4}
    assert ttft["attainment"]["1h"] == pytest.approx(0.75)
    assert ttft["met"] == {"5m": True, "1h": False}
    assert ttft["budget_remaining"] == pytest.approx(1 - 1 / 0.4)
    assert ttft["burn_rate"]["1h"] == pytest.approx(2.5)
    assert set(acme["objectives"]) == {"ttft", "e2e", "availability"}
    assert acme["status"] == "missed"
    assert acme["totals"]["requests"] == 4 and acme["totals"]["prompt_tokens"] == 40
    assert acme["totals"]["cost_per_1k_tokens_usd"] == pytest.approx(0.004 * 1000 / 60)

    beta = data["tenants"][1]
    assert beta["error_rate"]["5m"] == 1.0
    assert beta["objectives"]["availability"]["met"]["1h"] is False
    assert beta["objectives"]["ttft"]["total"]["1h"] == 0  # the failed request is not judged on latency

    support = data["models"][1]
    assert support["requests"]["5m"] == 2
    assert support["objectives"]["ttft"]["threshold_s"] is None  # acme and beta disagree
    assert support["objectives"]["availability"]["good"]["5m"] == 1


def test_quiet_group_has_no_data(metrics, outcome, clock):
    metrics.observe(outcome())
    clock.advance(4000)
    [row] = dashboard_snapshot(metrics, None, now=0.0)["tenants"]
    assert row["status"] == "no-data"
    assert row["requests"] == {"5m": 0, "1h": 0}
    assert row["objectives"] == {}
    assert row["totals"]["requests"] == 1  # totals are since start


def test_other_row_sorts_last(clock, outcome):
    metrics = Metrics(CollectorRegistry(), 1, lambda t: SLOS["acme"])
    for tenant in ("zeta", "alpha", "beta"):
        metrics.observe(outcome(tenant=tenant))
    names = [row["name"] for row in dashboard_snapshot(metrics, None, now=0.0)["tenants"]]
    assert names == ["zeta", "other"]


def test_static_page_is_self_contained():
    html = DASHBOARD_HTML.read_text()
    assert "/dashboard/data" in html
    assert 'id="last-updated"' in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # offline: nothing remote
    assert "innerHTML" not in html  # names go in as text
