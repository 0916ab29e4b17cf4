"""`build_server`: one server's parts assembled from its `LoraplexConfig`, feature by feature."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from prometheus_client import CollectorRegistry

from adapters.disk_cache import AdapterDiskCache
from adapters.registry import Registry
from adapters.rollouts import RolloutStore
from adapters.store import open_store
from adapters.tiers import TIER_DISK, AdapterTiers, EngineTiers
from api.admin.serving import AdminService
from api.auth import Authenticator
from api.batch.files import FileBlobs
from api.batch.lines import Endpoint
from api.batch.runner import BatchRunner
from api.batch.serving import BatchService
from api.batch.store import BatchStore
from api.config import LoraplexConfig, ServingOptions
from api.generation.accounting import Accounts, OutcomeSink
from api.generation.adapter_loading import AdapterLoader
from api.generation.admission import EngineAdmission
from api.generation.cache_salt import CacheSalts
from api.generation.limits import TenantLimits
from api.generation.mixtures import Mixtures
from api.generation.resolve import ModelResolver
from api.generation.virtual_model_table import VirtualModelTable
from api.graphs.serving import GraphService
from api.jobs.runner import JobRunner
from api.jobs.serving import JobService
from api.lifecycle import Lifecycle
from api.observability.drift import DriftCollector, DriftMonitor
from api.observability.drift_store import DRIFT_FILE, DriftStore
from api.observability.history import History
from api.observability.history_events import HistoryTierEvents
from api.observability.lora_info import LoraActivity, LoraInfoCollector
from api.observability.outcome import RequestOutcome
from api.observability.request_metrics import EngineGauges, Metrics
from api.observability.requestlog import log_request
from api.observability.residency import ResidencyCollector
from api.openai.chat import ChatService
from api.openai.completion import CompletionService
from api.openai.models import ModelCatalog
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from api.openai.tokenize import TokenizeService
from api.ops.cluster import ClusterView, ReplicaCollector
from api.pipeline.request import Pipeline
from api.responses.serving import ResponsesService
from api.responses.store import ResponseStore
from api.routing.landing import FallbackLoader
from api.routing.metrics import RoutingMetrics
from api.routing.serving import RoutingService
from api.routing.shadow import ShadowRunner
from api.routing.traffic import Traffic
from api.sagemaker.serving import InvocationService
from api.server.dashboard import Dashboard, admission_counts
from api.server.holder import Server
from api.server.loops import ServerLoops
from api.tenancy.adapter_slots import AdapterSlots
from api.tenancy.billing import LedgerWriter
from api.tenancy.config import BATCH_PRIORITY, TenancyConfig
from api.tenancy.fair_admission import FairAdmission
from api.tenancy.ledger import UsageLedger, default_ledger_path
from api.tenancy.limits_backend import LimitsBackend, MemoryLimits
from api.tenancy.limits_redis import RedisLimits
from api.tenancy.pricing import ComputeMeter, PriceTable
from api.tenancy.quotas import day_start, month_start
from engine.adapter_ids import adapter_name_of
from engine.tracing import Tracing
from engine.types import EngineClient

LOCAL_TIERS = "local"


def build_server(engine: EngineClient, registry: Registry, config: LoraplexConfig, *,
                 tiers: EngineTiers | Literal["local"] | None = LOCAL_TIERS, cluster: ClusterView | None = None,
                 tracing: Tracing | None = None) -> Server:
    """`tiers`: "local" builds the engine-slot, CPU and disk tiers here for `engine` (sized by `config.engine` and
    `config.registry`); tiers kept elsewhere stand for them (the replicas' of the scale-out mode, with `cluster`
    their view); None: no adapter tiers (the fake engine of HTTP-layer tests). `tracing` replaces the one
    `config.serving.otlp_endpoint` describes (tests pass an in-memory exporter). Raises GraphError listing every
    problem of the tenants file's virtual models."""
    tenancy = config.tenancy
    virtual = VirtualModelTable(engine.model_id, registry, tenancy.virtual_models)
    watch = _observability(engine, config, cluster)
    placed = (_local_tiers(engine, registry, config, watch.tier_events) if isinstance(tiers, str)
              else _Tiers(tiers, None, None))
    engine_tiers = placed.tiers
    queue = FairAdmission.from_config(tenancy.admission, config.admission_size, placed.adapter_slots)
    watch.metrics.set_admission_source(lambda: admission_counts(queue))
    if cluster is None:
        max_loras = config.engine.max_loras
        watch.metrics.registry.register(LoraInfoCollector(lambda: lora_activity(engine, queue, max_loras)))
        if placed.tiers is not None:
            watch.metrics.registry.register(ResidencyCollector(placed.tiers.residency))
    tracing = tracing or Tracing(config.serving.otlp_endpoint)
    lifecycle = Lifecycle()
    meter = ComputeMeter(tenancy.machine_cost_per_hour)
    billing = LedgerWriter(watch.ledger)
    rollouts = RolloutStore(registry.index)
    routing_metrics = RoutingMetrics(watch.metrics.registry, watch.metrics.model_label)
    traffic = Traffic(registry, rollouts, config.routing, routing_metrics)
    shadows = ShadowRunner(engine, queue, engine_tiers, rollouts, routing_metrics, lambda: meter.usd_per_token,
                           config.routing.adapter_load_deadline_s)
    # Batch lines stay out of the latency metrics, SLOs, dashboard history and rollout comparisons (they wait
    # for capacity by design; traffic reads them for its breakers only); the batch gauges count them, the
    # ledger and the request log record them.
    sink = OutcomeSink([live_only(lambda outcome, finish: watch.metrics.observe(outcome)),
                        live_only(lambda outcome, finish: watch.history.record(outcome)),
                        log_request, lambda outcome, finish: traffic.observe(outcome)],
                       batch_readers=[billing.record_many])
    resolver = ModelResolver(engine.model_id, registry, Mixtures(registry, tenancy.mixtures))
    prices = PriceTable(tenancy)
    loader = AdapterLoader(engine_tiers, tracing)
    pipeline = Pipeline(
        engine=engine, tenancy=tenancy, lifecycle=lifecycle,
        accounts=Accounts(sink, tenancy, prices, meter, watch.metrics.in_flight, lifecycle),
        resolver=resolver, limits=TenantLimits(limits_backend(config.serving, tenancy, watch.ledger)),
        admission=EngineAdmission(tenancy, queue, loader, tracing),
        loading=FallbackLoader(loader, traffic.breakers, routing_metrics, config.routing.adapter_load_deadline_s),
        tracing=tracing,
        input_limits=config.input_limits, billing=billing, cache_salts=CacheSalts(), traffic=traffic,
        shadows=shadows, prices=prices, drift=watch.drift,
    )
    template = Path(config.serving.chat_template).read_text() if config.serving.chat_template else None
    chat = ChatService(pipeline, template, config.serving.tool_call_parser)
    completion = CompletionService(pipeline)
    graphs = GraphService(virtual, tenancy)
    queued = _queued_work(config, chat, completion, graphs, lifecycle, queue)
    watch.metrics.set_batch_source(lambda: queued.batches.runner.gauges(queue.stats().background_running))
    catalog = ModelCatalog(resolver, virtual)
    routing = RoutingService(rollouts, traffic, config.routing.ab_min_samples)
    dashboard = Dashboard(watch.metrics, watch.history, watch.drift, queue, engine_tiers,
                          placed.disk, routing, queued.batches, cluster)
    return Server(
        config=config, engine=engine, registry=registry, lifecycle=lifecycle, auth=Authenticator(tenancy),
        tiers=engine_tiers, disk=placed.disk, cluster=cluster,
        metrics=watch.metrics, history=watch.history, drift=watch.drift, drift_store=watch.drift_store,
        ledger=watch.ledger, meter=meter, tracing=tracing, pipeline=pipeline, catalog=catalog, chat=chat,
        completion=completion, responses=ResponsesService(chat, ResponseStore(watch.ledger.url)),
        tokenizing=TokenizeService(chat, catalog, tenancy, config.input_limits),
        sagemaker=InvocationService(chat, completion, engine.model_id), graphs=graphs, batches=queued.batches,
        jobs=queued.jobs, routing=routing,
        admin=AdminService(registry, engine_tiers, config.serving.max_upload_bytes,
                           config.serving.prewarm_on_promote),
        loops=ServerLoops(dashboard.sample_history, billing, watch.drift, watch.drift_store, queued.batches.runner,
                          queued.jobs.runner),
        dashboard=dashboard,
    )


@dataclass(frozen=True)
class _Observability:
    metrics: Metrics
    history: History
    tier_events: HistoryTierEvents
    drift: DriftMonitor
    drift_store: DriftStore
    ledger: UsageLedger


def _observability(engine: EngineClient, config: LoraplexConfig, cluster: ClusterView | None) -> _Observability:
    """Metrics, dashboard history and drift, and the ledger and drift stores they are kept in."""
    # Collectors without names (gauges read at scrape time) stay in a `name[]`-filtered scrape.
    metrics = Metrics(CollectorRegistry(support_collectors_without_names=True), config.serving.metrics_top_n,
                      config.tenancy.slo_for)
    metrics.set_engine_source(lambda: _engine_gauges(engine))
    if cluster is not None:
        metrics.registry.register(ReplicaCollector(cluster))
    drift = DriftMonitor(config.drift)
    metrics.registry.register(DriftCollector(drift))
    history = History(metrics.tenant_label, metrics.model_label, time.time)
    ledger = UsageLedger(config.serving.ledger_url or default_ledger_path(),
                         synchronous=config.serving.ledger_synchronous)
    drift_store = DriftStore(config.drift.drift_path or ledger.path.with_name(DRIFT_FILE))
    drift.restore(drift_store.load())
    return _Observability(metrics, history, HistoryTierEvents(metrics.adapters, history), drift, drift_store, ledger)


@dataclass(frozen=True)
class _Tiers:
    tiers: EngineTiers | None
    disk: AdapterDiskCache | None
    adapter_slots: AdapterSlots | None  # admission's view of the engine slots, when it is adapter-aware


def _local_tiers(engine: EngineClient, registry: Registry, config: LoraplexConfig,
                 events: HistoryTierEvents) -> _Tiers:
    disk = AdapterDiskCache(config.registry.resolved_disk_cache_dir(), config.registry.disk_cache_bytes,
                            registry.store, on_evict=lambda entry: events.evicted(entry.label, TIER_DISK))
    for name in config.pins:
        disk.pin(name)
    tiers = AdapterTiers(engine, disk, registry.check_folder, events, config.engine.max_loras,
                         config.engine.max_cpu_loras, frozenset(config.pins))
    admission = config.tenancy.admission
    slots = (AdapterSlots(config.engine.max_loras, tiers.engine_slots, admission.adapter_slot_wait_s)
             if admission.adapter_aware else None)
    return _Tiers(tiers, disk, slots)


@dataclass(frozen=True)
class _QueuedWork:
    batches: BatchService
    jobs: JobService


def _queued_work(config: LoraplexConfig, chat: ChatService, completion: CompletionService, graphs: GraphService,
                 lifecycle: Lifecycle, queue: FairAdmission) -> _QueuedWork:
    """Batches and async jobs over the chat and completions endpoints, in their store; they stop when the server
    drains."""
    # Queued work names virtual models like live requests do: the graphs dispatch it.
    endpoints = {"/v1/chat/completions": Endpoint(ChatCompletionRequest, graphs.dispatching(chat)),
                 "/v1/completions": Endpoint(CompletionRequest, graphs.dispatching(completion))}
    store = BatchStore(config.batch.store_path())
    blobs = FileBlobs(open_store(config.batch.files_uri()))
    batch_runner = BatchRunner(store, blobs, endpoints, config.tenancy, config.batch, lambda: lifecycle.draining,
                               lambda: queue.background.may_start(1))
    job_runner = JobRunner(store, endpoints, config.batch)
    lifecycle.on_drain += [batch_runner.stop_all, job_runner.stop_all]
    return _QueuedWork(BatchService(store, blobs, batch_runner, config.batch),
                       JobService(store, job_runner, endpoints, config.batch))


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


def lora_activity(engine: EngineClient, queue: FairAdmission, max_loras: int) -> LoraActivity:
    """Adapter names with requests in the engine, and with requests waiting in it or in admission."""
    load = engine.load()
    waiting = {adapter_name_of(n) for n in load.waiting_by_adapter} | {
        label.rsplit("@", 1)[0] for label in queue.waiting_adapters()}
    return LoraActivity(tuple(adapter_name_of(n) for n in load.running_by_adapter), tuple(waiting), max_loras)


def _engine_gauges(engine: EngineClient) -> EngineGauges:
    load = engine.load()
    return EngineGauges(load.running, load.waiting, load.kv_cache_usage, engine.num_unfinished_requests(),
                        load.generation_tokens)
