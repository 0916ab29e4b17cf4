"""Prometheus metrics of the HTTP layer, in a registry owned by the app (no process-wide globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.types import EngineClient

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# Client closed the connection before the response finished (nginx's convention).
STATUS_CLIENT_CLOSED = 499
# Label for requests refused before their model resolved: user strings never become label values.
UNKNOWN_MODEL = "unknown"


class ServerMetrics:
    def __init__(self, engine: EngineClient):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "loraplex_requests", "Finished HTTP generation requests by model and HTTP status.",
            ["model", "status"], registry=r,
        )
        self.prompt_tokens = Counter(
            "loraplex_prompt_tokens", "Prompt tokens of served requests.", ["model"], registry=r
        )
        self.completion_tokens = Counter(
            "loraplex_completion_tokens", "Completion tokens generated.", ["model"], registry=r
        )
        self.ttft = Histogram(
            "loraplex_time_to_first_token_seconds", "Time from arrival to the first output token.",
            ["model"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.e2e = Histogram(
            "loraplex_e2e_request_latency_seconds", "Time from arrival to the last byte of the response.",
            ["model"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.in_flight = Gauge("loraplex_requests_in_flight", "Generation requests being served.", registry=r)
        running = Gauge("loraplex_engine_running_requests", "Requests the engine core is running.", registry=r)
        running.set_function(lambda: engine.load().running)
        waiting = Gauge("loraplex_engine_waiting_requests", "Requests waiting in the engine core.", registry=r)
        waiting.set_function(lambda: engine.load().waiting)
        unfinished = Gauge(
            "loraplex_engine_unfinished_requests", "Requests the engine frontend still tracks.", registry=r
        )
        unfinished.set_function(engine.num_unfinished_requests)
        kv = Gauge("loraplex_engine_kv_cache_usage_ratio", "Fraction of KV-cache blocks in use.", registry=r)
        kv.set_function(lambda: engine.load().kv_cache_usage)

    def observe(self, model: str, status: int, prompt_tokens: int, completion_tokens: int,
                ttft: float | None, e2e: float) -> None:
        self.requests.labels(model=model, status=str(status)).inc()
        self.prompt_tokens.labels(model=model).inc(prompt_tokens)
        self.completion_tokens.labels(model=model).inc(completion_tokens)
        if ttft is not None:
            self.ttft.labels(model=model).observe(ttft)
        self.e2e.labels(model=model).observe(e2e)

    def observe_rejected(self, status: int) -> None:
        """A request refused before its model was known."""
        self.requests.labels(model=UNKNOWN_MODEL, status=str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
