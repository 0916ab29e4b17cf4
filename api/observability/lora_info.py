"""`vllm:lora_requests_info` in vLLM's own shape, so routers built for vLLM (the Gateway API Inference Extension's
endpoint picker, llm-d) can send a request to a loraplex server that already runs its adapter.

vLLM sets one gauge per distinct label set to the time of its last update; routers read the newest sample. Here a
collector yields one sample per scrape, at the scrape's time, so no stale label sets pile up. The labels carry
adapter names as clients send them in `model` (not the engine's internal name with its content hash):
`running_lora_adapters` those with requests in the engine, `waiting_lora_adapters` those with requests waiting in
the engine or in loraplex's admission queue, `max_lora` the engine slots."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LORA_INFO = "vllm:lora_requests_info"


@dataclass(frozen=True)
class LoraActivity:
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    max_loras: int


def comma_list(names: set[str]) -> str:
    return ",".join(sorted(names))


class LoraInfoCollector(Collector):
    def __init__(self, source: Callable[[], LoraActivity], clock: Callable[[], float] = time.time):
        self._source = source
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        activity = self._source()
        gauge = GaugeMetricFamily(LORA_INFO, "Running stats on lora requests.",
                                  labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"])
        gauge.add_metric([str(activity.max_loras), comma_list(set(activity.waiting)),
                          comma_list(set(activity.running))], self._clock())
        yield gauge
