"""`loraplex_adapter_resident`: which adapter version sits in which engine tier (engine slots, CPU), one series
each, for operators and routers that pick a server by adapter affinity. Disk is left out: its entries are many and
a request finds them there almost as slowly as in the store. The replicas of the scale-out mode report theirs as
`loraplex_replica_adapter_resident` (api/ops/cluster.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class ResidencyCollector(Collector):
    def __init__(self, source: Callable[[], dict[str, list[str]]]):
        self._source = source  # tier -> adapter version labels resident there

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily("loraplex_adapter_resident", "1 for each adapter version resident in an engine "
                                  "tier (engine slots, CPU).", labels=["tier", "adapter"])
        for tier, labels in self._source().items():
            for label in labels:
                gauge.add_metric([tier, label], 1)
        yield gauge
