"""Builds one server's parts from its configs and holds them: what the routes find in `app.state.server`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field

from adapters.disk_cache import AdapterDiskCache
from adapters.identity import parse_model_ref
from adapters.registry import Registry
from adapters.rollouts import RolloutStore
from adapters.store import open_store
from adapters.tiers import TIER_DISK, AdapterTiers, EngineTiers
from api.admin.serving import AdminService
from api.auth import Authenticator
from api.batch.config import BatchConfig
from api.batch.files import FileBlobs
from api.batch.lines import Endpoint
from api.batch.runner import BatchRunner
from api.batch.serving import BatchService
from api.batch.store import BatchStore
from api.generation.accounting import Accounts, OutcomeSink
from api.generation.adapter_loading import AdapterLoader
from api.generation.admission import EngineAdmission
from api.generation.cache_salt import CacheSalts
from api.generation.limits import TenantLimits
from api.generation.resolve import ModelResolver
from api.generation.virtual_model_table import VirtualModelTable
from api.graphs.serving import GraphService
from api.input_limits import InputLimits
from api.jobs.runner import JobRunner
from api.jobs.serving import JobService
from api.lifecycle import Lifecycle
from api.observability.dashboard import dashboard_snapshot
from api.observability.drift import DEFAULT_DRIFT, DriftCollector, DriftConfig, DriftMonitor
from api.observability.drift_store import DRIFT_FILE, SAVE_INTERVAL_S, DriftStore
from api.observability.history import FINE, History
from api.observability.history_events import HistoryTierEvents
from api.observability.history_json import slo_points
from api.observability.outcome import RequestOutcome
from api.observability.request_metrics import AdmissionCounts, EngineGauges, Metrics
from api.observability.requestlog import log_request
from api.openai.chat import ChatService
from api.openai.completion import CompletionService
from api.openai.models import ModelCatalog
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from api.openai.tokenize import TokenizeService
from api.openai.tool_parser import ToolCallParserName
from api.ops.cluster import ClusterView, ReplicaCollector
from api.pipeline.request import Pipeline
from api.responses.serving import ResponsesService
from api.responses.store import ResponseStore
from api.routing.config import RoutingConfig
from api.routing.metrics import RoutingMetrics
from api.routing.serving import RoutingService
from api.routing.shadow import ShadowRunner
from api.routing.traffic import TrafficRouter
from api.sagemaker.serving import InvocationService
from api.tenancy.adapter_slots import AdapterSlots
from api.tenancy.admission import FairAdmission
from api.tenancy.billing import LedgerWriter
from api.tenancy.config import BATCH_PRIORITY, TenancyConfig
from api.tenancy.ledger import UsageLedger, default_ledger_path
from api.tenancy.limits import day_start, month_start
from api.tenancy.limits_backend import LimitsBackend, MemoryLimits
from api.tenancy.limits_redis import DEFAULT_LEASE_S, RedisLimits
from api.tenancy.pricing import ComputeMeter, PriceTable
from engine.tracing import Tracing
from engine.types import EngineClient

logger = logging.getLogger(__name__)

HISTORY_SAMPLE_S = FINE.seconds
BILLING_RETRY_S = 2.0


class ServingOptions(BaseModel):
    """How the server around the engine behaves: tenants, ledger, drain, metrics, tracing, admin."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: str | None = Field(default=None, description="Tenants YAML (keys, limits, prices, SLOs); "
                               "without it the server runs open with one default tenant.")
    ledger_url: str | None = Field(default=None, description="Usage ledger: a SQLite file (a path or "
                                   "sqlite:///path), or postgresql://user@host/db for one ledger shared by replicas "
                                   "(default: $LORAPLEX_HOME/usage.sqlite).")
    limits_url: str | None = Field(default=None, pattern=r"^(redis|rediss|unix)://",
                                   description="Where tenant limits are counted: unset for this process alone, "
                                   "or redis://host:port/db to enforce them across every replica sharing that "
                                   "Redis.")
    limits_lease_s: float = Field(default=DEFAULT_LEASE_S, gt=0, description="With Redis limits: how long the "
                                  "slots and tokens of a replica that died stay reserved (a live one renews "
                                  "its leases every third of this).")
    ledger_synchronous: Literal["NORMAL", "FULL"] = Field(
        default="NORMAL", description="SQLite synchronous mode of the ledger: NORMAL survives a killed "
        "process, FULL also a power loss.")
    drain_timeout_s: float = Field(default=30.0, ge=0, description="On SIGTERM, how long running requests "
                                   "may take to finish before the server exits.")
    metrics_top_n: int = Field(default=50, ge=1, description="Distinct tenants, models and adapters with "
                               "their own metric labels; the rest are labelled 'other'.")
    otlp_endpoint: str | None = Field(default=None, description="OTLP/HTTP endpoint for traces "
                                      "(default: no tracing).")
    prewarm_on_promote: bool = Field(default=False, description="Load an adapter version into the engine "
                                     "when it is promoted.")
    max_upload_bytes: int = Field(default=512 * 2**20, ge=1, description="Largest adapter archive the "
                                  "admin API accepts, in bytes.")
    chat_template: str | None = Field(default=None, description="A Jinja chat template file used instead of the "
                                      "model's own, as vLLM's --chat-template (default: the model's own; the "
                                      "smollm2 demo: its template that renders tools).")
    tool_call_parser: ToolCallParserName | None = Field(
        default=None, description="How tool_choice 'auto' finds the calls in a reply, as vLLM's "
        "--tool-call-parser: hermes (JSON objects in <tool_call> tags); without it 'auto' is refused (default: "
        "none; the smollm2 demo: hermes).")


@dataclass
class Server:
    """Every part of one server, built by `build_server`; the routes reach them through `app.state.server`."""

    engine: EngineClient
    registry: Registry
    tenancy: TenancyConfig
    options: ServingOptions
    auth: Authenticator
    metrics: Metrics
    ledger: UsageLedger
    tiers: EngineTiers | None
    disk: AdapterDiskCache | None
    meter: ComputeMeter
    tracing: Tracing
    lifecycle: Lifecycle
    pipeline: Pipeline
    catalog: ModelCatalog
    input_limits: InputLimits
    history: History
    routing: RoutingService
    graphs: GraphService
    drift: DriftMonitor
    drift_store: DriftStore
    pins: tuple[str, ...] = ()
    batch_config: BatchConfig = field(default_factory=BatchConfig)
    cluster: ClusterView | None = None  # the engine replicas of the scale-out mode
    chat: ChatService = field(init=False)
    completion: CompletionService = field(init=False)
    admin: AdminService = field(init=False)
    sagemaker: InvocationService = field(init=False)
    tokenizing: TokenizeService = field(init=False)
    batches: BatchService = field(init=False)
    jobs: JobService = field(init=False)
    responses: ResponsesService = field(init=False)

    def __post_init__(self) -> None:
        self._background: list[asyncio.Task[None]] = []
        template = Path(self.options.chat_template).read_text() if self.options.chat_template else None
        self.chat = ChatService(self.pipeline, template, self.options.tool_call_parser)
        self.responses = ResponsesService(self.chat, ResponseStore(self.ledger.url))
        self.completion = CompletionService(self.pipeline)
        # Queued work names virtual models like live requests do: the graphs dispatch it.
        endpoints = {"/v1/chat/completions": Endpoint(ChatCompletionRequest, self.graphs.dispatching(self.chat)),
                     "/v1/completions": Endpoint(CompletionRequest, self.graphs.dispatching(self.completion))}
        store = BatchStore(self.batch_config.store_path())
        blobs = FileBlobs(open_store(self.batch_config.files_uri()))
        queue = self.pipeline.admission.queue
        self.batch_runner = BatchRunner(store, blobs, endpoints, self.tenancy, self.batch_config,
                                        lambda: self.lifecycle.draining, lambda: queue.background_may_start(1))
        self.lifecycle.on_drain.append(self.batch_runner.stop_all)
        self.metrics.set_batch_source(lambda: self.batch_runner.gauges(queue.stats().background_running))
        self.batches = BatchService(store, blobs, self.batch_runner, self.batch_config)
        self.job_runner = JobRunner(store, endpoints, self.batch_config)
        self.lifecycle.on_drain.append(self.job_runner.stop_all)
        self.jobs = JobService(store, self.job_runner, endpoints, self.batch_config)
        self.admin = AdminService(self.registry, self.tiers, self.options.max_upload_bytes,
                                  self.options.prewarm_on_promote)
        self.sagemaker = InvocationService(self.chat, self.completion, self.engine.model_id)
        self.tokenizing = TokenizeService(self.chat, self.catalog, self.tenancy, self.input_limits)

    async def started(self) -> None:
        """After the engine started: listen to its steps, warm the pinned adapters, then report ready."""
        add_listener = getattr(self.engine, "add_step_listener", None)
        if add_listener is not None:
            add_listener(self._on_step)
        for name in self.pins:
            result = await self.admin.load(self.registry.resolve(parse_model_ref(name)))
            logger.info("pinned %s (%s)", result.model, result.found_in)
        self._background = [asyncio.create_task(self._sample_history()),
                            asyncio.create_task(self._retry_billing()),
                            asyncio.create_task(self._save_drift()),
                            asyncio.create_task(self.batch_runner.run()),
                            asyncio.create_task(self.job_runner.run())]
        self.lifecycle.ready = True

    async def _sample_history(self) -> None:
        """The dashboard history's gauges, once per fine interval, for the life of the server."""
        while True:
            self.sample_history()
            await asyncio.sleep(HISTORY_SAMPLE_S)

    async def _retry_billing(self) -> None:
        """Usage rows the ledger refused are retried until it takes them (their tenants are refused meanwhile)."""
        while True:
            await asyncio.sleep(BILLING_RETRY_S)
            if self.pipeline.billing.pending:
                await asyncio.to_thread(self.pipeline.billing.retry_pending)

    async def _save_drift(self) -> None:
        """The drift windows to their store while they change (and once more in `close`)."""
        saved = self.drift.changes
        while True:
            await asyncio.sleep(SAVE_INTERVAL_S)
            if self.drift.changes != saved:
                saved = self.drift.changes
                try:
                    await asyncio.to_thread(self.drift_store.save, self.drift.export())
                except Exception:  # the next interval tries again; serving goes on
                    logger.exception("saving drift windows failed")

    def sample_history(self) -> None:
        data = self.dashboard_data()
        self.history.sample(_admission_counts(self.pipeline.admission.queue),
                            {tier: len(names) for tier, names in data["residency"].items()}, slo_points(data))

    def _on_step(self, wall: float, tokens: int, busy: bool) -> None:
        self.meter.on_step(wall, tokens, busy)
        if self.tiers is not None:
            self.tiers.on_step(self.engine.load().running_by_adapter)

    def dashboard_data(self) -> dict:
        residency = self.tiers.residency() if self.tiers is not None else {}
        if self.disk is not None:
            residency[TIER_DISK] = [e.label for e in self.disk.entries()]
        data = {**dashboard_snapshot(self.metrics, residency, time.time(), self.drift.snapshot()),
                "routing": self.routing.panel()}
        data["batches"] = self.batches.dashboard_rows()
        if self.cluster is not None:
            data["replicas"] = {rid: {"residency": r.residency, "ongoing": r.ongoing, "running": r.running,
                                      "waiting": r.waiting, "requests": self.cluster.routed.get(rid, 0)}
                                for rid, r in self.cluster.reports.items()}
        return data

    def stop_background(self) -> None:
        """Before shutdown: batch lines stop (they stay pending in the store, for the next start)."""
        self.batch_runner.stop_all()
        self.job_runner.stop_all()
        for task in self._background:
            task.cancel()

    def close(self) -> None:
        self.stop_background()
        self.batches.store.close()
        self.responses.store.close()
        self.tracing.shutdown()
        self.pipeline.billing.spill()
        self.pipeline.limits.close()
        self.ledger.close()
        try:
            self.drift_store.save(self.drift.export())
        except Exception:
            logger.exception("saving drift windows failed")
        self.drift_store.close()
        self.registry.close()


@dataclass(frozen=True)
class TierSizes:
    max_loras: int
    max_cpu_loras: int
    disk_dir: Path
    disk_bytes: int


def build_server(engine: EngineClient, registry: Registry, tenancy: TenancyConfig, options: ServingOptions,
                 tiers_sizes: TierSizes | None, pins: tuple[str, ...] = (), max_running: int | None = None,
                 tracing: Tracing | None = None, input_limits: InputLimits = InputLimits(),
                 routing: RoutingConfig = RoutingConfig(), drift_config: DriftConfig = DEFAULT_DRIFT,
                 batch_config: BatchConfig = BatchConfig(), remote_tiers: EngineTiers | None = None,
                 cluster: ClusterView | None = None) -> Server:
    """`tiers_sizes` None: no adapter tiers here (the fake engine of HTTP-layer tests), unless `remote_tiers` stands
    for tiers the engine keeps itself (the replicas of the scale-out mode, `engine.cluster.client.ClusterTiers`).
    `max_running` is the engine's batch size, used unless the tenants file sets its own admission size. `tracing`
    replaces the one `options.otlp_endpoint` describes (tests pass an in-memory exporter). Raises GraphError
    listing every problem of the tenants file's virtual models."""
    virtual = VirtualModelTable(engine.model_id, registry, tenancy.virtual_models)
    # Collectors without names (gauges read at scrape time) stay in a `name[]`-filtered scrape.
    metrics = Metrics(CollectorRegistry(support_collectors_without_names=True), options.metrics_top_n, tenancy.slo_for)
    drift = DriftMonitor(drift_config)
    metrics.registry.register(DriftCollector(drift))
    history = History(metrics.tenant_label, metrics.model_label, time.time)
    tier_events = HistoryTierEvents(metrics.adapters, history)
    ledger = UsageLedger(options.ledger_url or default_ledger_path(),
                         synchronous=options.ledger_synchronous)
    drift_store = DriftStore(drift_config.drift_path or ledger.path.with_name(DRIFT_FILE))
    drift.restore(drift_store.load())
    tiers, disk, adapter_slots = remote_tiers, None, None
    if tiers_sizes is not None:
        disk = AdapterDiskCache(tiers_sizes.disk_dir, tiers_sizes.disk_bytes, registry.store,
                                on_evict=lambda entry: tier_events.evicted(entry.label, TIER_DISK))
        for name in pins:
            disk.pin(name)
        local = AdapterTiers(engine, disk, registry.check_folder, tier_events, tiers_sizes.max_loras,
                             tiers_sizes.max_cpu_loras, frozenset(pins))
        if tenancy.admission.adapter_aware:
            adapter_slots = AdapterSlots(tiers_sizes.max_loras, local.engine_slots,
                                         tenancy.admission.adapter_slot_wait_s)
        tiers = local
    if "max_running" in tenancy.admission.model_fields_set or max_running is None:
        max_running = tenancy.admission.max_running
    queue = FairAdmission(max_running, tenancy.admission.max_queued,
                          reserve_window_s=tenancy.admission.reserve_window_s,
                          max_queued_per_tenant=tenancy.admission.max_queued_per_tenant,
                          max_queue_wait_s=tenancy.admission.max_queue_wait_s,
                          max_background_with_live=tenancy.admission.max_batch_running_with_live,
                          background_quiet_s=tenancy.admission.batch_quiet_s, adapters=adapter_slots)
    metrics.set_engine_source(lambda: _engine_gauges(engine))
    if cluster is not None:
        metrics.registry.register(ReplicaCollector(cluster))
    metrics.set_admission_source(lambda: _admission_counts(queue))
    tracing = tracing or Tracing(options.otlp_endpoint)
    lifecycle = Lifecycle()
    meter = ComputeMeter(tenancy.machine_cost_per_hour)

    billing = LedgerWriter(ledger)
    rollouts = RolloutStore(registry.index)
    routing_metrics = RoutingMetrics(metrics.registry, metrics.model_label)
    router = TrafficRouter(registry, rollouts, routing, routing_metrics)
    shadows = ShadowRunner(engine, queue, tiers, rollouts, routing_metrics, lambda: meter.usd_per_token,
                           routing.adapter_load_deadline_s)
    # Batch lines stay out of the latency metrics, SLOs, dashboard history and rollout comparisons (they wait
    # for capacity by design; the router reads them for its breakers only); the batch gauges count them, the
    # ledger and the request log record them.
    sink = OutcomeSink([live_only(lambda outcome, finish: metrics.observe(outcome)),
                        live_only(lambda outcome, finish: history.record(outcome)), billing.record, log_request,
                        lambda outcome, finish: router.observe(outcome)])
    resolver = ModelResolver(engine.model_id, registry)
    prices = PriceTable(tenancy)
    loader = AdapterLoader(tiers, tracing)
    pipeline = Pipeline(
        engine=engine, tenancy=tenancy, lifecycle=lifecycle,
        accounts=Accounts(sink, tenancy, prices, meter, metrics.in_flight, lifecycle),
        resolver=resolver, limits=TenantLimits(limits_backend(options, tenancy, ledger)),
        admission=EngineAdmission(tenancy, queue, loader, tracing), loader=loader, tracing=tracing,
        input_limits=input_limits, billing=billing, cache_salts=CacheSalts(), router=router, shadows=shadows,
        prices=prices, drift=drift,
    )
    return Server(
        engine=engine, registry=registry, tenancy=tenancy, options=options, auth=Authenticator(tenancy),
        metrics=metrics, ledger=ledger, tiers=tiers, disk=disk, meter=meter, tracing=tracing, lifecycle=lifecycle,
        pipeline=pipeline, catalog=ModelCatalog(resolver, virtual), input_limits=input_limits, history=history,
        routing=RoutingService(rollouts, router, routing.ab_min_samples), graphs=GraphService(virtual, tenancy),
        drift=drift, drift_store=drift_store, pins=pins, batch_config=batch_config,
        cluster=cluster,
    )


def live_only(reader: Callable[[RequestOutcome, str], None]) -> Callable[[RequestOutcome, str], None]:
    return lambda outcome, finish: None if outcome.priority == BATCH_PRIORITY else reader(outcome, finish)


def limits_backend(options: ServingOptions, tenancy: TenancyConfig, ledger: UsageLedger) -> LimitsBackend:
    """Memory (unset) or Redis (`redis://`, `rediss://`, `unix://`), with each tenant's day and month budgets
    seeded from the ledger (Redis keeps counts already there)."""
    limits = {tenant.name: tenant.limits for tenant in tenancy.tenants}
    url = options.limits_url
    if url is None:
        backend: LimitsBackend = MemoryLimits(limits)
    else:
        backend = RedisLimits(url, limits, lease_s=options.limits_lease_s)
    wall = time.time()
    for tenant in tenancy.tenants:
        backend.seed_usage(tenant.name, ledger.tokens_in(tenant.name, day_start(wall)),
                           ledger.tokens_in(tenant.name, month_start(wall)))
    return backend


def _engine_gauges(engine: EngineClient) -> EngineGauges:
    load = engine.load()
    return EngineGauges(load.running, load.waiting, load.kv_cache_usage, engine.num_unfinished_requests(),
                        load.generation_tokens)


def _admission_counts(admission: FairAdmission) -> dict[str, AdmissionCounts]:
    stats = admission.stats()
    tenants = set(stats.running_by_tenant) | set(stats.queued_by_tenant)
    return {t: AdmissionCounts(stats.queued_by_tenant.get(t, 0), stats.running_by_tenant.get(t, 0))
            for t in tenants}
