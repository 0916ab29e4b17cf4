"""What the server shows of its engine replicas (scale-out mode), without importing Ray: a protocol the
`RayEngineClient` satisfies, the `/cluster` route, and per-replica Prometheus metrics."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from api.errors import OpenAIError


class ReplicaState(Protocol):
    replica_id: str
    residency: dict[str, list[str]]
    running: int
    waiting: int
    kv_cache_usage: float
    ongoing: int
    loads: int
    load_seconds: float


class ClusterView(Protocol):
    reports: Mapping[str, ReplicaState]  # replica id -> its latest report
    routed: Mapping[str, int]  # replica id -> requests it took

    async def status(self) -> dict: ...


cluster_router = APIRouter(tags=["operations"])


@cluster_router.get("/cluster")
async def cluster(request: Request) -> Response:
    """The engine replicas (admin key when tenants are configured): residency, load and requests taken, each."""
    server = request.app.state.server
    server.auth.admin(request.headers.get("authorization"))
    if server.cluster is None:
        raise OpenAIError(404, "This server runs one engine in process (no --replicas).", code="not_found")
    return JSONResponse(await server.cluster.status())


class ReplicaCollector(Collector):
    """Per-replica gauges and counters, from the latest report each replica sent with a response."""

    def __init__(self, view: ClusterView):
        self._view = view

    def collect(self) -> Iterator:
        reports = dict(self._view.reports)
        gauges = {
            "ongoing": GaugeMetricFamily("loraplex_replica_ongoing_requests", "Requests on the replica.",
                                         labels=["replica"]),
            "running": GaugeMetricFamily("loraplex_replica_running_sequences", "Sequences the replica's engine "
                                         "runs.", labels=["replica"]),
            "waiting": GaugeMetricFamily("loraplex_replica_waiting_sequences", "Sequences queued in the replica's "
                                         "engine.", labels=["replica"]),
            "kv": GaugeMetricFamily("loraplex_replica_kv_cache_usage", "KV-cache use of the replica's engine.",
                                    labels=["replica"]),
        }
        resident = GaugeMetricFamily("loraplex_replica_resident_adapters", "Adapter versions resident per tier.",
                                     labels=["replica", "tier"])
        each = GaugeMetricFamily("loraplex_replica_adapter_resident", "1 for each adapter version resident in a "
                                 "replica's tier (engine slots, CPU).", labels=["replica", "tier", "adapter"])
        loads = CounterMetricFamily("loraplex_replica_adapter_loads", "Adapter loads into the replica's engine.",
                                    labels=["replica"])
        routed = CounterMetricFamily("loraplex_replica_requests", "Requests routed to the replica.",
                                     labels=["replica"])
        for rid, r in reports.items():
            gauges["ongoing"].add_metric([rid], r.ongoing)
            gauges["running"].add_metric([rid], r.running)
            gauges["waiting"].add_metric([rid], r.waiting)
            gauges["kv"].add_metric([rid], r.kv_cache_usage)
            for tier, labels in r.residency.items():
                resident.add_metric([rid, tier], len(labels))
                for label in labels:
                    each.add_metric([rid, tier, label], 1)
            loads.add_metric([rid], r.loads)
        for rid, count in dict(self._view.routed).items():
            routed.add_metric([rid], count)
        yield from gauges.values()
        yield from (resident, each, loads, routed)
