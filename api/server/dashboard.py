"""`Dashboard`: the dashboard's data (`GET /dashboard/data`, shape in `api.observability.dashboard`) gathered from
the server's parts, and the history samples taken from it."""

from __future__ import annotations

import time

from adapters.disk_cache import AdapterDiskCache
from adapters.tiers import TIER_DISK, EngineTiers
from api.batch.serving import BatchService
from api.observability.dashboard import dashboard_snapshot
from api.observability.drift import DriftMonitor
from api.observability.history import History
from api.observability.history_json import slo_points
from api.observability.request_metrics import AdmissionCounts, Metrics
from api.ops.cluster import ClusterView
from api.routing.serving import RoutingService
from api.tenancy.fair_admission import FairAdmission


class Dashboard:
    def __init__(self, metrics: Metrics, history: History, drift: DriftMonitor, queue: FairAdmission,
                 tiers: EngineTiers | None, disk: AdapterDiskCache | None, routing: RoutingService,
                 batches: BatchService, cluster: ClusterView | None):
        self._metrics = metrics
        self._history = history
        self._drift = drift
        self._queue = queue
        self._tiers = tiers
        self._disk = disk
        self._routing = routing
        self._batches = batches
        self._cluster = cluster

    def data(self) -> dict:
        residency = self._tiers.residency() if self._tiers is not None else {}
        if self._disk is not None:
            residency[TIER_DISK] = [e.label for e in self._disk.entries()]
        data = {**dashboard_snapshot(self._metrics, residency, time.time(), self._drift.snapshot()),
                "routing": self._routing.panel(), "batches": self._batches.dashboard_rows()}
        if self._cluster is not None:
            data["replicas"] = {rid: {"residency": r.residency, "ongoing": r.ongoing, "running": r.running,
                                      "waiting": r.waiting, "requests": self._cluster.routed.get(rid, 0)}
                                for rid, r in self._cluster.reports.items()}
        return data

    def sample_history(self) -> None:
        data = self.data()
        self._history.sample(admission_counts(self._queue),
                             {tier: len(names) for tier, names in data["residency"].items()}, slo_points(data))


def admission_counts(admission: FairAdmission) -> dict[str, AdmissionCounts]:
    stats = admission.stats()
    tenants = set(stats.running_by_tenant) | set(stats.queued_by_tenant)
    return {t: AdmissionCounts(stats.queued_by_tenant.get(t, 0), stats.running_by_tenant.get(t, 0))
            for t in tenants}
