"""The scale-out mode's views, with a stand-in for the Ray-backed engine client (no Ray, no engine)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest

from api.ops.cluster import ReplicaCollector


@dataclass
class Report:
    replica_id: str
    residency: dict[str, list[str]]
    running: int = 1
    waiting: int = 0
    kv_cache_usage: float = 0.5
    ongoing: int = 2
    loads: int = 3
    load_seconds: float = 0.1


@dataclass
class View:
    reports: dict = field(default_factory=dict)
    routed: dict = field(default_factory=dict)

    async def status(self) -> dict:
        return {}


def test_replica_metrics_have_one_series_per_replica():
    view = View({"r1": Report("r1", {"engine": ["a@1"], "cpu": ["a@1", "b@1"]}), "r2": Report("r2", {"cpu": []})},
                {"r1": 5, "r2": 7})
    registry = CollectorRegistry()
    registry.register(ReplicaCollector(view))
    text = generate_latest(registry).decode()
    assert 'loraplex_replica_resident_adapters{replica="r1",tier="cpu"} 2.0' in text
    assert 'loraplex_replica_resident_adapters{replica="r2",tier="cpu"} 0.0' in text
    assert 'loraplex_replica_requests_total{replica="r2"} 7.0' in text
    assert 'loraplex_replica_ongoing_requests{replica="r1"} 2.0' in text
    assert 'loraplex_replica_adapter_loads_total{replica="r1"} 3.0' in text


def test_the_single_process_server_never_imports_ray():
    code = ("import sys, api.cli.main, api.app, api.server.build; from api.cli.main import build_parser; "
            "build_parser().parse_args(['serve']); assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_cluster_route_is_404_without_replicas(fake_client):
    response = await fake_client.get("/cluster")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
