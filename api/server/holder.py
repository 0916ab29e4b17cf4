"""`Server`: every part of one server, built by `api.server.build.build_server`; the routes reach them through
`app.state.server`."""

from __future__ import annotations

from dataclasses import dataclass

from adapters.disk_cache import AdapterDiskCache
from adapters.registry import Registry
from adapters.tiers import EngineTiers
from api.admin.serving import AdminService
from api.auth import Authenticator
from api.batch.serving import BatchService
from api.config import LoraplexConfig
from api.graphs.serving import GraphService
from api.jobs.serving import JobService
from api.lifecycle import Lifecycle
from api.observability.drift import DriftMonitor
from api.observability.drift_store import DriftStore
from api.observability.history import History
from api.observability.request_metrics import Metrics
from api.openai.chat import ChatService
from api.openai.completion import CompletionService
from api.openai.models import ModelCatalog
from api.openai.tokenize import TokenizeService
from api.ops.cluster import ClusterView
from api.pipeline.request import Pipeline
from api.responses.serving import ResponsesService
from api.routing.serving import RoutingService
from api.sagemaker.serving import InvocationService
from api.server.dashboard import Dashboard
from api.server.loops import ServerLoops
from api.tenancy.ledger import UsageLedger
from api.tenancy.pricing import ComputeMeter
from engine.tracing import Tracing
from engine.types import EngineClient


@dataclass(frozen=True)
class Server:
    config: LoraplexConfig
    engine: EngineClient
    registry: Registry
    lifecycle: Lifecycle
    auth: Authenticator
    # where adapters live: tiers None without any (the fake engine of HTTP-layer tests); disk None in scale-out
    tiers: EngineTiers | None
    disk: AdapterDiskCache | None
    cluster: ClusterView | None  # the engine replicas of the scale-out mode
    # what the server observes and keeps
    metrics: Metrics
    history: History
    drift: DriftMonitor
    drift_store: DriftStore
    ledger: UsageLedger
    meter: ComputeMeter
    tracing: Tracing
    # the request path and the services over it
    pipeline: Pipeline
    catalog: ModelCatalog
    chat: ChatService
    completion: CompletionService
    responses: ResponsesService
    tokenizing: TokenizeService
    sagemaker: InvocationService
    graphs: GraphService
    batches: BatchService
    jobs: JobService
    routing: RoutingService
    admin: AdminService
    loops: ServerLoops
    dashboard: Dashboard
