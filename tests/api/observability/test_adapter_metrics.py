from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from api.observability.adapter_metrics import AdapterMetrics


class Metrics:
    """An AdapterMetrics on its own registry, read back by sample name."""

    def __init__(self, top_n: int = 10):
        self.registry = CollectorRegistry()
        self.adapters = AdapterMetrics(self.registry, top_n)


def make_metrics(top_n: int = 10) -> Metrics:
    return Metrics(top_n)


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def label_sets(metrics: Metrics, sample_name: str) -> set[tuple[tuple[str, str], ...]]:
    return {tuple(sorted(s.labels.items())) for family in metrics.registry.collect()
            for s in family.samples if s.name == sample_name}


def test_adapter_cache_metrics():
    metrics = make_metrics(top_n=2)
    metrics.adapters.cache_hit("a", "engine")
    metrics.adapters.cache_hit("a", "engine")
    metrics.adapters.cache_miss("b", "engine")
    metrics.adapters.cache_hit("b", "cpu")
    metrics.adapters.cache_miss("c", "disk")
    metrics.adapters.observe_load("cpu", 0.25)
    metrics.adapters.observe_load("engine", 0.5)
    for adapter in ("a", "b", "c", "d"):
        metrics.adapters.set_resident(adapter, "engine", True)
    metrics.adapters.evicted("b", "engine")
    assert value(metrics, "loraplex_adapter_cache_hits_total", adapter="a", tier="engine") == 2
    assert value(metrics, "loraplex_adapter_cache_misses_total", adapter="b", tier="engine") == 1
    assert value(metrics, "loraplex_adapter_cache_misses_total", adapter="other", tier="disk") == 1
    assert value(metrics, "loraplex_adapter_load_seconds_count", tier="cpu") == 1
    assert value(metrics, "loraplex_adapter_load_seconds_sum", tier="engine") == 0.5
    assert value(metrics, "loraplex_adapter_evictions_total", tier="engine") == 1
    assert value(metrics, "loraplex_adapter_resident", adapter="a", tier="engine") == 1
    assert value(metrics, "loraplex_adapter_resident", adapter="b", tier="engine") == 0
    assert value(metrics, "loraplex_adapter_resident", adapter="other", tier="engine") == 2  # c and d
    adapters = {dict(labels)["adapter"] for labels in label_sets(metrics, "loraplex_adapter_resident")}
    assert adapters == {"a", "b", "other"}


@pytest.mark.parametrize("call", [
    lambda m: m.adapters.cache_hit("a", "gpu"),
    lambda m: m.adapters.cache_miss("a", ""),
    lambda m: m.adapters.observe_load("ram", 1.0),
    lambda m: m.adapters.set_resident("a", "Engine", True),
])
def test_unknown_tier_is_refused(call):
    with pytest.raises(ValueError, match="tier"):
        call(make_metrics())
