"""Prometheus series of the routing step, on the server's metric registry. Adapter labels are bounded by the
request metrics' model labels (top-N), arms and policies are fixed sets."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from api.routing.breaker import BreakerState


class RoutingMetrics:
    def __init__(self, registry: CollectorRegistry, label: Callable[[str], str]):
        self.label = label
        self.routed = Counter("loraplex_rollout_requests", "Requests a rollout routed, by adapter and arm.",
                              ("adapter", "arm"), registry=registry)
        self.rollbacks = Counter("loraplex_rollout_rollbacks", "Rollouts rolled back automatically by their guard.",
                                 ("adapter",), registry=registry)
        self.fallbacks = Counter("loraplex_fallbacks", "Requests served by the next version in their fallback "
                                 "chain, by the version that could not serve and why.",
                                 ("adapter_version", "reason"), registry=registry)
        self.shadows = Counter("loraplex_shadow_requests", "Shadow copies on a candidate by outcome "
                               "(completed, skipped: no idle slot, preempted: a primary needed the slot, failed).",
                               ("adapter", "outcome"), registry=registry)
        self.shadow_exact = Counter("loraplex_shadow_exact_matches", "Completed shadows whose output equalled the "
                                    "primary's.", ("adapter",), registry=registry)
        self.shadow_cost = Counter("loraplex_shadow_cost_usd", "Measured compute cost of shadow copies (internal, "
                                   "never billed to a tenant).", ("adapter",), registry=registry)
        self._breakers: Callable[[], dict[str, BreakerState]] = dict
        registry.register(_BreakerCollector(self))

    def set_breaker_source(self, source: Callable[[], dict[str, BreakerState]]) -> None:
        self._breakers = source


class _BreakerCollector:
    def __init__(self, metrics: RoutingMetrics):
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("loraplex_breaker_state", "Circuit breaker of an adapter version: 0 closed, "
                                   "1 half-open, 2 open.", labels=("adapter_version",))
        worst: dict[str, int] = {}  # versions past the label bound share `other`: it shows the worst of them
        for label, state in self._metrics._breakers().items():
            bounded = self._metrics.label(label)
            worst[bounded] = max(worst.get(bounded, 0), int(state))
        for label, state in sorted(worst.items()):
            family.add_metric((label,), state)
        yield family
