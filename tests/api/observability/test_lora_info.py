"""The adapter-affinity series routers read: vLLM's `vllm:lora_requests_info` shape, and residency per tier."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.observability.lora_info import LoraActivity, LoraInfoCollector
from api.observability.residency import ResidencyCollector


def samples(collector) -> list[tuple[str, dict[str, str], float]]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


@pytest.mark.parametrize(("activity", "running", "waiting"), [
    (LoraActivity((), (), 4), "", ""),
    (LoraActivity(("b", "a", "b"), ("c",), 4), "a,b", "c"),  # names once each, sorted
    (LoraActivity(("a",), ("a", "d", "c"), 4), "a", "a,c,d"),  # an adapter may both run and wait
])
def test_one_sample_in_vllms_shape_at_the_scrapes_time(activity, running, waiting):
    [(name, labels, value)] = samples(LoraInfoCollector(lambda: activity, clock=lambda: 1234.5))
    assert name == "vllm:lora_requests_info" and value == 1234.5
    assert labels == {"max_lora": "4", "running_lora_adapters": running, "waiting_lora_adapters": waiting}


def test_residency_is_one_series_per_resident_version():
    residency = {"engine": ["a@1"], "cpu": ["a@1", "b@2"]}
    assert samples(ResidencyCollector(lambda: residency)) == [
        ("loraplex_adapter_resident", {"tier": "engine", "adapter": "a@1"}, 1.0),
        ("loraplex_adapter_resident", {"tier": "cpu", "adapter": "a@1"}, 1.0),
        ("loraplex_adapter_resident", {"tier": "cpu", "adapter": "b@2"}, 1.0),
    ]
