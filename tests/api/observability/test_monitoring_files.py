"""docker/: the Prometheus scrape config and the Grafana dashboard only name metrics that `Metrics` exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from api.observability.request_metrics import AdmissionCounts, EngineGauges, Metrics
from api.observability.slo import DEFAULT_SLO

DOCKER = Path(__file__).resolve().parents[3] / "docker"
GRAFANA = DOCKER / "grafana" / "loraplex-dashboard.json"
METRIC = re.compile(r"\bloraplex_[a-z0-9_]+")


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Sample names of a Metrics that has seen every kind of event."""
    from api.observability.outcome import RequestOutcome

    metrics = Metrics(CollectorRegistry(), 10, lambda tenant: DEFAULT_SLO)
    metrics.observe(RequestOutcome("r", "acme", "normal", "support", "3", 200, 10, 5, 0.01, 0.2, 0.6,
                                   (0.1, 0.1), 0.002, 0.001, 0.0))
    metrics.observe_rejected(401)
    metrics.set_engine_source(lambda: EngineGauges(1, 2, 0.5, 3, 40))
    metrics.set_admission_source(lambda: {"acme": AdmissionCounts(1, 1)})
    metrics.adapters.cache_hit("support@3", "engine")
    metrics.adapters.cache_miss("support@3", "cpu")
    metrics.adapters.observe_load("engine", 0.1)
    metrics.adapters.set_resident("support@3", "engine", True)
    metrics.adapters.evicted("support@3", "cpu")
    return {sample.name for family in text_string_to_metric_families(metrics.render().decode())
            for sample in family.samples}


def dashboard() -> dict:
    return json.loads(GRAFANA.read_text())


def expressions(dash: dict) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        query = var.get("query")
        exprs.append(query["query"] if isinstance(query, dict) else query or "")
    return exprs


def test_grafana_dashboard_is_well_formed():
    dash = dashboard()
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert all(t["expr"] and t["refId"] for t in panel["targets"])
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "tenant"}


def test_grafana_panels_only_use_exported_metrics(exported):
    referenced = {name for expr in expressions(dashboard()) for name in METRIC.findall(expr)}
    assert len(referenced) >= 20
    assert referenced - exported == set()


@pytest.mark.parametrize("needle", [
    "loraplex_time_to_first_token_seconds_bucket",
    "loraplex_time_per_output_token_seconds_bucket",
    "loraplex_slo_burn_rate",
    "loraplex_slo_error_budget_remaining_ratio",
    "loraplex_cost_per_1k_tokens_usd",
    "loraplex_adapter_cache_hits_total",
    "loraplex_adapter_resident",
    "loraplex_engine_kv_cache_usage_ratio",
    "loraplex_engine_waiting_requests",
])
def test_grafana_covers_the_issue_panels(needle):
    assert any(needle in expr for expr in expressions(dashboard()))


def test_grafana_quantiles_are_by_model_version():
    exprs = expressions(dashboard())
    for metric in ("loraplex_time_to_first_token_seconds", "loraplex_time_per_output_token_seconds"):
        [expr] = [e for e in exprs if f"{metric}_bucket" in e]
        assert expr.startswith("histogram_quantile(0.95, sum by (le, model, version)")


def test_prometheus_scrapes_loraplex():
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "loraplex"]
    assert job["metrics_path"] == "/metrics"
    assert job.get("scrape_interval", config["global"]["scrape_interval"]) == "15s"
    [target] = job["static_configs"][0]["targets"]
    assert target.endswith(":8000")
