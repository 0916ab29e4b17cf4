"""Prometheus metrics of finished requests, SLOs, engine load and admission (adapter tiers: adapter_metrics).

Everything lives in a registry the caller owns (no process-wide globals). Label values that come from tenants,
models and adapters pass through `LabelBounder`s, so a series set never grows past `top_n` values per label.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from api.observability.adapter_metrics import AdapterMetrics
from api.observability.labels import OTHER, LabelBounder
from api.observability.outcome import UNKNOWN, RequestOutcome
from api.observability.slo import LATENCY_OBJECTIVES, SloTargets, SloWindowTracker
from api.observability.usage_totals import GroupSnapshot, MetricsSnapshot, UsageTotals

REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
# The window the error-budget gauge reports; burn rates are reported for every window.
BUDGET_WINDOW = "1h"
LABELS = ("tenant", "model", "version")


class EngineGauges(NamedTuple):
    running: int
    waiting: int
    kv_cache_usage: float  # 0..1
    unfinished: int
    generation_tokens: int  # counter: every token the engine generated, delivered or not


class BatchGauges(NamedTuple):
    batches: Mapping[str, int]  # by status, every batch in the store
    lines: Mapping[str, int]  # by state, lines of unfinished batches
    running_lines: int  # holding engine slots
    waiting_lines: int  # in flight, waiting for capacity live traffic leaves free
    preemptions: int  # counter: batch lines stopped to give their slots to live requests


class AdmissionCounts(NamedTuple):
    queued: int
    running: int


class Metrics:
    """`slo_for(tenant)` gives a tenant's objectives. The SLO windows are kept per raw (tenant, model@version),
    bounded by configuration (authenticated tenants, catalogued models) and dropped after an idle hour; every
    exported label and snapshot group is bounded by `top_n`."""

    def __init__(self, registry: CollectorRegistry, top_n: int, slo_for: Callable[[str], SloTargets],
                 tracker: SloWindowTracker | None = None):
        self.registry = r = registry
        self._slo_for = slo_for
        self.tracker = tracker or SloWindowTracker(slo_for)
        self._tenants = LabelBounder(top_n, pinned=(UNKNOWN,))
        self._models = LabelBounder(top_n, pinned=(UNKNOWN,))
        self._lock = threading.Lock()
        self._totals: dict[tuple[str, str], UsageTotals] = {}  # (tenant label, model@version label)
        self._engine_source: Callable[[], EngineGauges] | None = None
        self._admission_source: Callable[[], Mapping[str, AdmissionCounts]] | None = None
        self._batch_source: Callable[[], BatchGauges] | None = None

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=r)

        self.queue_time = hist("loraplex_queue_time_seconds", "Time waiting for admission.", REQUEST_BUCKETS)
        self.ttft = hist("loraplex_time_to_first_token_seconds", "Arrival to first output token.", REQUEST_BUCKETS)
        self.itl = hist("loraplex_inter_token_latency_seconds", "Gap between successive output chunks.",
                        TOKEN_BUCKETS)
        self.tpot = hist("loraplex_time_per_output_token_seconds", "Mean time per output token after the first.",
                         TOKEN_BUCKETS)
        self.e2e = hist("loraplex_e2e_request_latency_seconds", "Arrival to last byte.", REQUEST_BUCKETS)
        # prometheus_client appends `_total` to counter names.
        self.requests = Counter("loraplex_requests", "Finished requests by HTTP status.", (*LABELS, "status"),
                                registry=r)
        self.prompt_tokens = Counter("loraplex_prompt_tokens", "Prompt tokens.", LABELS, registry=r)
        self.completion_tokens = Counter("loraplex_completion_tokens", "Completion tokens handed to clients.",
                                         LABELS, registry=r)
        self.slo_requests = Counter("loraplex_slo_requests", "Requests judged against an objective.",
                                    (*LABELS, "objective", "result"), registry=r)
        self.cost = Counter("loraplex_cost_usd", "Measured compute cost.", LABELS, registry=r)
        self.price = Counter("loraplex_price_usd", "Amount charged to tenants.", LABELS, registry=r)
        self.cost_per_1k = Gauge("loraplex_cost_per_1k_tokens_usd", "Cost per 1000 tokens since start.", LABELS,
                                 registry=r)
        self.price_per_1k = Gauge("loraplex_price_per_1k_tokens_usd", "Price per 1000 tokens since start.", LABELS,
                                  registry=r)
        self.in_flight = Gauge("loraplex_requests_in_flight", "Generation requests being served.", registry=r)
        self.adapters = AdapterMetrics(r, top_n)
        r.register(_ScrapeTimeCollector(self))

    # --- requests ------------------------------------------------------------------------------------------------

    def observe(self, outcome: RequestOutcome) -> None:
        """Everything about one finished request; call exactly once per request.

        Latency objectives judge only served requests (status < 400): an error's or a disconnect's timings say
        nothing about serving speed. Availability judges every request by `outcome.succeeded`.
        """
        tenant = self._tenants.bound(outcome.tenant)
        model_version = self._models.bound(outcome.model_version)
        model, version = (OTHER, "") if model_version == OTHER else (outcome.model, outcome.version)
        labels = {"tenant": tenant, "model": model, "version": version}

        self.requests.labels(**labels, status=str(outcome.status)).inc()
        self.queue_time.labels(**labels).observe(outcome.queue_seconds)
        if outcome.ttft_seconds is not None:
            self.ttft.labels(**labels).observe(outcome.ttft_seconds)
        tpot = outcome.tpot_seconds
        if tpot is not None:
            self.tpot.labels(**labels).observe(tpot)
        itl = self.itl.labels(**labels)
        for gap in outcome.inter_token_seconds:
            itl.observe(gap)
        self.e2e.labels(**labels).observe(outcome.e2e_seconds)
        self.prompt_tokens.labels(**labels).inc(outcome.prompt_tokens)
        self.completion_tokens.labels(**labels).inc(outcome.completion_tokens)
        self.cost.labels(**labels).inc(outcome.cost_usd)
        self.price.labels(**labels).inc(outcome.price_usd)

        served = outcome.status < 400
        values = {"ttft": outcome.ttft_seconds, "tpot": tpot, "e2e": outcome.e2e_seconds} if served else {}
        targets = self._slo_for(outcome.tenant)
        for name in LATENCY_OBJECTIVES:
            target, value = getattr(targets, name), values.get(name)
            if target is not None and value is not None:
                self.slo_requests.labels(**labels, objective=name,
                                         result="met" if value <= target.seconds else "missed").inc()
        self.slo_requests.labels(**labels, objective="availability",
                                 result="met" if outcome.succeeded else "missed").inc()
        self.tracker.record(outcome.tenant, outcome.model_version, ttft=values.get("ttft"), tpot=values.get("tpot"),
                            e2e=values.get("e2e"), success=outcome.succeeded)

        with self._lock:
            totals = self._totals.setdefault((tenant, model_version), UsageTotals())
            totals.add(UsageTotals(1, 0 if outcome.succeeded else 1, outcome.prompt_tokens,
                                   outcome.completion_tokens, outcome.cost_usd, outcome.price_usd))
            cost_1k, price_1k = totals.cost_per_1k_tokens, totals.price_per_1k_tokens
        if cost_1k is not None and price_1k is not None:
            self.cost_per_1k.labels(**labels).set(cost_1k)
            self.price_per_1k.labels(**labels).set(price_1k)

    def tenant_label(self, tenant: str) -> str:
        """The bounded label a tenant is reported under (its own name, or `other`)."""
        return self._tenants.bound(tenant)

    def model_label(self, model_version: str) -> str:
        """The bounded label an adapter version (or the base model) is reported under."""
        return self._models.bound(model_version)

    def observe_rejected(self, status: int, tenant: str = UNKNOWN) -> None:
        """A request refused before its model was known (bad key, unknown model, malformed body)."""
        self.requests.labels(tenant=self._tenants.bound(tenant), model=UNKNOWN, version="", status=str(status)).inc()

    # --- sources read at scrape time --------------------------------------------------------------------------

    def set_engine_source(self, source: Callable[[], EngineGauges]) -> None:
        self._engine_source = source

    def set_batch_source(self, source: Callable[[], BatchGauges]) -> None:
        self._batch_source = source

    def set_admission_source(self, source: Callable[[], Mapping[str, AdmissionCounts]]) -> None:
        """`source()` maps raw tenant names to their queued and running requests."""
        self._admission_source = source

    # --- output ------------------------------------------------------------------------------------------------

    def render(self, names: Sequence[str] = ()) -> bytes:
        """The exposition; with `names`, only those samples (a histogram's are `<name>_bucket`, `_sum`,
        `_count`), and only their collectors run."""
        return generate_latest(self.registry.restricted_registry(names) if names else self.registry)

    def snapshot(self) -> MetricsSnapshot:
        """Totals since start and windowed SLO summaries, per bounded tenant and per bounded model@version."""
        by_tenant = self.tracker.summaries(lambda t, mv: self._tenants.bound(t))
        by_model = self.tracker.summaries(lambda t, mv: self._models.bound(mv))
        with self._lock:
            totals = dict(self._totals)
        tenant_totals: dict[str, UsageTotals] = {}
        model_totals: dict[str, UsageTotals] = {}
        for (tenant, model_version), t in totals.items():
            tenant_totals.setdefault(tenant, UsageTotals()).add(t)
            model_totals.setdefault(model_version, UsageTotals()).add(t)
        return MetricsSnapshot(
            tenants={name: GroupSnapshot(t, by_tenant.get(name, {})) for name, t in tenant_totals.items()},
            models={name: GroupSnapshot(t, by_model.get(name, {})) for name, t in model_totals.items()},
        )

    def _scrape_families(self) -> Iterator[Metric]:
        budget = GaugeMetricFamily("loraplex_slo_error_budget_remaining_ratio",
                                   f"Error budget left over the last {BUDGET_WINDOW}: 1 untouched, <0 overspent.",
                                   labels=("tenant", "objective"))
        burn = GaugeMetricFamily("loraplex_slo_burn_rate", "Bad-request ratio over the allowed ratio.",
                                 labels=("tenant", "objective", "window"))
        for tenant, windows in self.tracker.summaries(lambda t, mv: self._tenants.bound(t), latency=False).items():
            for window, summary in windows.items():
                for objective, status in summary.objectives.items():
                    burn.add_metric((tenant, objective, window), status.burn_rate)
                    if window == BUDGET_WINDOW:
                        budget.add_metric((tenant, objective), status.budget_remaining)
        yield budget
        yield burn
        if self._engine_source is not None:
            load = self._engine_source()
            for name, doc, value in (
                ("running_requests", "Requests the engine core is running.", load.running),
                ("waiting_requests", "Requests waiting in the engine core, those deferred for want of an adapter "
                 "slot included.", load.waiting),
                ("kv_cache_usage_ratio", "Fraction of KV-cache blocks in use.", load.kv_cache_usage),
                ("unfinished_requests", "Requests the engine frontend still tracks.", load.unfinished),
            ):
                yield GaugeMetricFamily(f"loraplex_engine_{name}", doc, value=value)
            yield CounterMetricFamily("loraplex_engine_generation_tokens", "Tokens the engine generated, including "
                                      "those of requests aborted before delivery.", value=load.generation_tokens)
        if self._admission_source is not None:
            queued = GaugeMetricFamily("loraplex_admission_queued_requests", "Requests waiting for admission.",
                                       labels=("tenant",))
            running = GaugeMetricFamily("loraplex_admission_running_requests", "Requests admitted and not finished.",
                                        labels=("tenant",))
            per_label: dict[str, list[int]] = {}
            for tenant, counts in self._admission_source().items():
                acc = per_label.setdefault(self._tenants.bound(tenant), [0, 0])
                acc[0] += counts.queued
                acc[1] += counts.running
            for tenant, (q, n) in per_label.items():
                queued.add_metric((tenant,), q)
                running.add_metric((tenant,), n)
            yield queued
            yield running
        if self._batch_source is not None:
            yield from _batch_families(self._batch_source())


def _batch_families(gauges: BatchGauges) -> Iterator[Metric]:
    batches = GaugeMetricFamily("loraplex_batches", "Batches by status.", labels=("status",))
    for status, n in sorted(gauges.batches.items()):
        batches.add_metric((status,), n)
    lines = GaugeMetricFamily("loraplex_batch_lines", "Lines of unfinished batches by state (pending, done, "
                              "failed, cancelled, expired).", labels=("state",))
    for state, n in sorted(gauges.lines.items()):
        lines.add_metric((state,), n)
    yield batches
    yield lines
    yield GaugeMetricFamily("loraplex_batch_running_lines", "Batch lines holding engine slots.",
                            value=gauges.running_lines)
    yield GaugeMetricFamily("loraplex_batch_waiting_lines", "Batch lines waiting for capacity live traffic leaves "
                            "free.", value=gauges.waiting_lines)
    yield CounterMetricFamily("loraplex_batch_preemptions", "Batch lines stopped to give their engine slots to "
                              "live requests (each runs again later).", value=gauges.preemptions)


class _ScrapeTimeCollector:
    """Families computed when scraped: SLO gauges from the sliding windows, engine and admission sources."""

    def __init__(self, metrics: Metrics):
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics._scrape_families()

