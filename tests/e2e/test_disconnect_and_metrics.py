"""A dropped stream is aborted in the engine; /health and /metrics report what happened."""

from __future__ import annotations

import json
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.engine_gate import EngineGate, StreamReader, wait_until


def scrape(metrics_text) -> dict[tuple[str, tuple], float]:
    text = metrics_text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_until_idle(metrics_text, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(metrics_text)
        idle = all(value(samples, name) == 0 for name in (
            "loraplex_engine_unfinished_requests", "loraplex_engine_running_requests",
            "loraplex_engine_waiting_requests", "loraplex_requests_in_flight"))
        if idle or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def test_dropped_stream_is_aborted(server, server_process, adapter_names, acme, metrics_text):
    body = {"model": adapter_names[0], "prompt": "tell me a long story", "max_tokens": 1000,
            "ignore_eos": True, "stream": True, "return_token_ids": True}
    labels = {"tenant": "acme", "model": adapter_names[0], "version": "1"}
    before = wait_until_idle(metrics_text)
    # The engine is held while the client drops the stream, so the drop reaches it mid-stream by construction.
    with EngineGate.of(server_process.proc.pid) as gate:
        stream = StreamReader(f"{server}/v1/completions", acme, body)
        gate.pulse_until(lambda: bool(stream.chunks))
        busy = scrape(lambda: metrics_text("loraplex_engine_unfinished_requests"))
        assert value(busy, "loraplex_engine_unfinished_requests") == 1
        stream.drop()
        received = sum(len(chunk["choices"][0]["token_ids"]) for chunk in stream.chunks)
        # The server saw the client go and closed the request before the engine ran another step.
        wait_until(lambda: value(scrape(lambda: metrics_text("loraplex_requests_in_flight")),
                                 "loraplex_requests_in_flight") == 0, "the dropped request closed")
    samples = wait_until_idle(metrics_text)
    assert value(samples, "loraplex_engine_unfinished_requests") == 0
    assert value(samples, "loraplex_engine_running_requests") == 0
    closed = value(samples, "loraplex_requests_total", **labels, status="499")
    assert closed == value(before, "loraplex_requests_total", **labels, status="499") + 1
    generated = value(samples, "loraplex_completion_tokens_total", **labels) - value(
        before, "loraplex_completion_tokens_total", **labels)
    engine_generated = value(samples, "loraplex_engine_generation_tokens_total") - value(
        before, "loraplex_engine_generation_tokens_total")
    # Counted at least what the client got, at most what the engine made; and the engine stopped: without the
    # abort it would have generated all 1000.
    assert 1 <= received <= generated <= engine_generated < 1000
    # Still serving.
    ok = httpx.post(f"{server}/v1/completions", json={**body, "stream": False, "max_tokens": 4}, timeout=60,
                    headers=acme)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4


def lora_info(samples) -> dict[str, str]:
    [labels] = [dict(labels) for (metric, labels) in samples if metric == "vllm:lora_requests_info"]
    return labels


def test_adapter_affinity_series_show_what_runs_and_what_is_resident(server, server_process, adapter_names, acme,
                                                                    metrics_text):
    """`vllm:lora_requests_info` in vLLM's shape (adapter names as clients send them) and one residency series
    per adapter version: the adapter waiting while the engine holds its request before a first token, then
    running while the stream is held mid-run."""
    name = adapter_names[1]
    body = {"model": name, "prompt": "tell me a long story", "max_tokens": 1000, "ignore_eos": True,
            "stream": True}
    wait_until_idle(metrics_text)
    # Resident first: the request then reaches the held engine instead of waiting for the adapter's load.
    warm = httpx.post(f"{server}/v1/completions", json={**body, "stream": False, "max_tokens": 1}, timeout=60,
                      headers=acme)
    assert warm.status_code == 200

    def info_now() -> dict[str, str]:
        return lora_info(scrape(lambda: metrics_text("vllm:lora_requests_info")))

    with EngineGate.of(server_process.proc.pid) as gate:
        stream = StreamReader(f"{server}/v1/completions", acme, body)
        wait_until(lambda: info_now()["waiting_lora_adapters"] == name, "the held engine's request waits")
        gate.pulse_until(lambda: bool(stream.chunks))
        running = scrape(lambda: metrics_text("vllm:lora_requests_info", "loraplex_adapter_resident"))
        stream.drop()
    info = lora_info(running)
    assert (info["max_lora"], info["running_lora_adapters"], info["waiting_lora_adapters"]) == ("2", name, "")
    assert value(running, "loraplex_adapter_resident", tier="engine", adapter=f"{name}@1") == 1
    wait_until(lambda: info_now()["running_lora_adapters"] == "", "the dropped stream's adapter no longer runs")


def test_metrics_count_known_traffic(server, base_model_id, keys, metrics_text):
    """Tenant `obs` sends nothing else, so its series move by exactly this traffic."""
    obs = keys.headers("obs")
    wait_until_idle(metrics_text)
    before = scrape(metrics_text)
    prompt_tokens = completion_tokens = 0
    for max_tokens in (3, 5, 7):
        response = httpx.post(f"{server}/v1/completions", timeout=60, headers=obs, json={
            "model": base_model_id, "prompt": "one two three", "max_tokens": max_tokens, "ignore_eos": True})
        usage = response.json()["usage"]
        prompt_tokens += usage["prompt_tokens"]
        completion_tokens += usage["completion_tokens"]
    httpx.post(f"{server}/v1/completions", json={"model": base_model_id, "prompt": "x", "max_tokens": -1},
               headers=obs)
    after = scrape(metrics_text)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    base = {"tenant": "obs", "model": base_model_id, "version": ""}
    assert delta("loraplex_requests_total", **base, status="200") == 3
    assert delta("loraplex_requests_total", tenant="obs", model="unknown", version="", status="400") == 1
    assert delta("loraplex_prompt_tokens_total", **base) == prompt_tokens
    assert delta("loraplex_completion_tokens_total", **base) == completion_tokens == 15
    assert delta("loraplex_time_to_first_token_seconds_count", **base) == 3
    assert delta("loraplex_e2e_request_latency_seconds_count", **base) == 3
    assert delta("loraplex_time_per_output_token_seconds_count", **base) == 3
    # 3, 5 and 7 tokens streamed one per step: 2 + 4 + 6 gaps between chunks.
    assert delta("loraplex_inter_token_latency_seconds_count", **base) == 12
    assert delta("loraplex_slo_requests_total", **base, objective="availability", result="met") == 3
    price = (prompt_tokens * 1.0 + completion_tokens * 2.0) / 1e6
    assert abs(delta("loraplex_price_usd_total", **base) - price) < 1e-12


def test_health(server):
    response = httpx.get(f"{server}/health")
    assert response.status_code == 200
    assert json.loads(response.text) == {"status": "ok"}
