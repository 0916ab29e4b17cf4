"""The Ray Serve request router that applies adapter affinity (`affinity.rank_replicas`).

It runs inside the deployment handle, in the server process. What it knows of a replica: the adapters the replica
reported resident in its last routing stats (`EngineReplica.record_routing_stats`, every few seconds), the adapters
it was sent since (assumed resident until the next report could show them), the requests waiting in its engine per
adapter (from the same report), and Ray's count of its ongoing requests.
"""

from __future__ import annotations

import random
import time

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from adapters.identity import parse_model_ref
from engine.cluster.affinity import ReplicaView, rank_replicas

ADAPTER_KWARG = "adapter_key"  # the keyword argument of EngineReplica.generate naming the adapter version
RESIDENT_STAT = "resident"
WAITING_STAT = "waiting"  # adapter name -> requests waiting in the replica's engine


class AdapterAffinityRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, max_ongoing: int = 8, max_waiting: float = 4.0, assume_s: float = 5.0,
                         **kwargs) -> None:
        """`max_ongoing`: the load at which a holder is passed over; `max_waiting`: the requests waiting for the
        adapter in a holder's engine at which it is passed over; `assume_s`: how long a replica sent an adapter
        counts as holding it without a report saying so."""
        self._max_ongoing = max_ongoing
        self._max_waiting = max_waiting
        self._assume_s = assume_s
        self._sent: dict[str, dict[str, float]] = {}  # replica id -> adapter -> when a request for it was sent

    def _view(self, replica: RunningReplica, now: float, adapter: str | None, name: str | None) -> ReplicaView:
        """`adapter`: the request's version label, `name` its adapter's name (the waiting counts are by name);
        only whether that adapter is starved there matters to the ranking."""
        rid = replica.replica_id.unique_id
        stats = replica.routing_stats or {}
        sent = {a for a, at in self._sent.get(rid, {}).items() if now - at < self._assume_s}
        waiting = stats.get(WAITING_STAT, {}).get(name, 0) if name is not None else 0
        starved = frozenset((adapter,)) if waiting >= self._max_waiting else frozenset()
        ongoing = self._replica_queue_len_cache.get(replica.replica_id) or 0
        return ReplicaView(rid, frozenset(stats.get(RESIDENT_STAT, ())) | sent, ongoing, starved)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        adapter = pending_request.kwargs.get(ADAPTER_KWARG) if pending_request is not None else None
        name = parse_model_ref(adapter).name if adapter is not None else None
        now = time.monotonic()
        shuffled = list(candidate_replicas)
        random.shuffle(shuffled)
        by_id = {r.replica_id.unique_id: r for r in shuffled}
        ranks = rank_replicas(adapter, [self._view(r, now, adapter, name) for r in shuffled], self._max_ongoing)
        return [[by_id[rid] for rid in rank] for rank in ranks]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        adapter = pending_request.kwargs.get(ADAPTER_KWARG)
        if adapter is not None:
            self._sent.setdefault(replica_id.unique_id, {})[adapter] = time.monotonic()

    def on_replica_actor_died(self, replica_id) -> None:
        self._sent.pop(replica_id.unique_id, None)
        super().on_replica_actor_died(replica_id)
