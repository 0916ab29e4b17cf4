"""Autoscaling that sees per-adapter queueing (`serve --autoscale`).

Ray Serve's own rule counts ongoing requests per replica. It does not see that an engine runs at most `--max-loras`
adapters at once: while that many run, requests for one more wait in the engine, however few requests the replica
has. Each replica therefore reports, with Ray Serve's metrics (`EngineReplica.record_autoscaling_stats`), how many
requests wait in its engine for each adapter; the Serve controller averages them over its look-back window and calls
`AdapterQueuePolicy`, which asks for the larger of Ray's count and enough replicas that no adapter has more than
`target_adapter_waiting` requests waiting per replica holding it. Ray Serve then applies the config's delays, factors
and bounds as usual.

This module runs in the Serve controller (pickled by value): it imports nothing of loraplex at module level.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

WAITING_PREFIX = "waiting:"  # + an adapter's name: the requests waiting for it in a replica's engine


def autoscaling_stats(waiting_by_adapter: Mapping[str, int], resident: Iterable[str]) -> dict[str, float]:
    """A replica's metrics: every adapter it holds (0 when none wait, so the controller's average falls back as its
    queue drains) and every adapter with requests waiting."""
    stats = {WAITING_PREFIX + name: 0.0 for name in resident}
    stats.update({WAITING_PREFIX + name: float(count) for name, count in waiting_by_adapter.items()})
    return stats


@dataclass(frozen=True)
class AdapterQueue:
    waiting: float  # requests waiting for the adapter, summed over replicas (each a look-back average)
    holders: int  # replicas that reported it


def adapter_queues(metrics: Mapping[str, Mapping[object, float]]) -> dict[str, AdapterQueue]:
    """The controller's aggregated metrics (metric -> replica -> value) as one queue per adapter."""
    return {name[len(WAITING_PREFIX):]: AdapterQueue(sum(by_replica.values()), len(by_replica))
            for name, by_replica in metrics.items() if name.startswith(WAITING_PREFIX) and by_replica}


def replicas_for_queues(current: int, queues: Mapping[str, AdapterQueue], target_waiting: float) -> int:
    """Replicas that leave no adapter more than `target_waiting` waiting requests per holder: the current count plus
    the holders the most starved adapter lacks (affinity routing passes over a holder with that many waiting, so a
    replica added takes the adapter's next requests); 0 when no adapter is over the target, so that Ray's count
    alone decides (and may scale down)."""
    lacking = max((math.ceil(q.waiting / target_waiting) - q.holders for q in queues.values()), default=0)
    return current + lacking if lacking > 0 else 0


class AdapterQueuePolicy:
    """Ray Serve custom autoscaling policy (a class: the controller builds it once with `policy_kwargs`)."""

    def __init__(self, target_adapter_waiting: float):
        self.target_adapter_waiting = target_adapter_waiting

    def __call__(self, ctx) -> tuple[float, dict]:
        from ray.serve.autoscaling_policy import replica_queue_length_autoscaling_policy

        by_ongoing, state = replica_queue_length_autoscaling_policy(ctx)
        if ctx.current_num_replicas == 0:  # scaled to zero: only the ongoing count can wake it
            return by_ongoing, state
        queues = adapter_queues(ctx.aggregated_metrics or {})
        by_queues = replicas_for_queues(ctx.current_num_replicas, queues, self.target_adapter_waiting)
        return max(by_ongoing, by_queues), state
