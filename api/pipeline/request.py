"""One generation request from arrival to its last byte: the template every OpenAI generation endpoint uses.

In order: refuse while draining, open the account, resolve `model`, route it (rollout arm, shadow, fallback
chain), prepare engine calls (prompt and output budget), reserve tenant limits, wait for fair admission, load
the first option of the route that can serve, then run the calls and stream or collect. Each step that takes
something registers its give-back on the account; `closes_on_failure` closes it on anything that escapes, so no
step can leak what it took. A streamed response hands its account to `framed_stream`, which closes it before the
last byte.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from pydantic import BaseModel

from api.auth import Caller
from api.errors import OpenAIError
from api.generation.accounting import Accounts, RequestAccount, closes_on_failure
from api.generation.admission import EngineAdmission
from api.generation.budget import OutputLimit
from api.generation.cache_salt import CacheSalts
from api.generation.fanout import EngineCall, run_calls
from api.generation.limits import TenantLimits
from api.generation.resolve import ModelResolver, ServedModel, visibility_of
from api.generation.sse import framed_stream
from api.input_limits import InputLimits
from api.lifecycle import Lifecycle
from api.observability.drift import DriftMonitor, watched
from api.routing.landing import FallbackLoader
from api.routing.shadow import ShadowRunner
from api.routing.traffic import Traffic
from api.tenancy.billing import LedgerWriter
from api.tenancy.config import BATCH_PRIORITY, TenancyConfig
from api.tenancy.pricing import PriceTable
from engine.tracing import Tracing, traced
from engine.types import ChoiceDelta, EngineClient

SERVED_MODEL_HEADER = "x-loraplex-model"


class GenerationRequest(Protocol):
    """What the template reads of a parsed request (chat or completions)."""

    model: str
    stream: bool
    user: str | None

    def output_limit(self) -> OutputLimit: ...


Req = TypeVar("Req", bound=GenerationRequest)
T = TypeVar("T")
BILLING_RETRY_AFTER_S = 5
# Inputs longer than this (characters) are tokenized in a worker thread.
TOKENIZE_OFF_LOOP_CHARS = 16 * 1024


@dataclass
class Reply:
    """A response body (an object, or SSE lines) and the headers to send with it. A streamed body comes with
    its still-open account: whoever sends it closes the account if the stream never runs to its end."""

    body: BaseModel | AsyncIterator[str]
    headers: dict[str, str]
    stream_account: RequestAccount | None = None


@dataclass(frozen=True)
class BatchLane:
    """Queued work through the same pipeline as a live request, billed at most once under `billing_key` however
    often it is retried or resumed. A batch line (`preempt` given) runs at background priority (`preempt` stops
    it when live traffic needs its slots) and is billed at the tenant's batch discount; an async job
    (`preempt` None) is admitted and priced like a live request."""

    billing_key: str
    preempt: Callable[[], None] | None = None

    @property
    def background(self) -> bool:
        """A batch line: background priority and price. An async job is admitted and priced like live work."""
        return self.preempt is not None


@dataclass(frozen=True)
class Pipeline:
    """The server parts a generation request passes through, in order."""

    engine: EngineClient
    tenancy: TenancyConfig
    lifecycle: Lifecycle
    accounts: Accounts
    resolver: ModelResolver
    limits: TenantLimits
    admission: EngineAdmission
    loading: FallbackLoader
    tracing: Tracing
    input_limits: InputLimits
    billing: LedgerWriter
    cache_salts: CacheSalts
    traffic: Traffic
    shadows: ShadowRunner
    prices: PriceTable
    drift: DriftMonitor | None = None  # None: no drift monitoring


@dataclass(frozen=True)
class Prepared:
    """A request made ready for the engine: its calls and the tokens to reserve for them."""

    calls: list[EngineCall]

    @property
    def reserve_tokens(self) -> int:
        """Prompt plus output budget of every sequence: what tenant token limits reserve at admission."""
        return sum(len(c.prompt_token_ids) + c.params.max_tokens * c.params.n for c in self.calls)

    @property
    def sequences(self) -> int:
        """What the engine runs: prompts x n. Admission and `max_concurrent` count these, not requests."""
        return sum(c.params.n for c in self.calls)


class GenerationService(ABC, Generic[Req]):
    """Subclasses only say how a request becomes engine calls and how deltas become response objects."""

    response_prefix = "cmpl"

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self.engine = pipeline.engine
        # Hugging Face fast tokenizers are not safe to call from two threads at once.
        self._tokenizer_lock = threading.Lock()

    @abstractmethod
    async def prepare(self, req: Req, response_id: str, tenant_cap: int | None) -> list[EngineCall]:
        """Engine calls of the request; `tenant_cap` is the tenant's output-token cap (None: none)."""

    async def tokenize(self, work: Callable[[], T], chars: int) -> T:
        """Runs `work` (tokenizer calls) under the tokenizer lock; in a worker thread when the input is large,
        so that other streams keep flowing while it runs."""

        def locked() -> T:
            with self._tokenizer_lock:
                return work()

        if chars > TOKENIZE_OFF_LOOP_CHARS:
            return await asyncio.to_thread(locked)
        return locked()

    @abstractmethod
    def stream_events(self, req: Req, served: ServedModel, response_id: str, created: int, calls: list[EngineCall],
                      deltas: AsyncIterator[ChoiceDelta], account: RequestAccount) -> AsyncIterator[str]:
        """SSE lines of the response (without the final [DONE])."""

    @abstractmethod
    async def collect(self, req: Req, served: ServedModel, response_id: str, created: int, calls: list[EngineCall],
                      deltas: AsyncIterator[ChoiceDelta], account: RequestAccount) -> BaseModel:
        """The whole response object."""

    async def check(self, req: Req, caller: Caller) -> int:
        """What `create` checks before admission, running nothing: `model` resolves for this caller and the
        engine calls can be prepared (prompt, output budget). Returns the tokens admission would reserve."""
        p = self.pipeline
        await p.resolver.resolve_request(req.model, visibility_of(p.tenancy, caller), p.tenancy.tenant(caller.tenant))
        tenant_cap = p.tenancy.tenant(caller.tenant).limits.max_tokens
        return Prepared(await self.prepare(req, f"{self.response_prefix}-check", tenant_cap)).reserve_tokens

    async def create(self, req: Req, caller: Caller, request_id: str, lane: BatchLane | None = None) -> Reply:
        """Resolves, admits and runs the request (a batch line when `lane` is given). The account closes exactly
        once on every path."""
        p = self.pipeline
        if p.lifecycle.draining:
            raise OpenAIError(503, "The server is shutting down.", code="draining")
        if p.billing.is_blocked(caller.tenant):
            raise OpenAIError(503, "Usage cannot be recorded right now, so this tenant is not served until it can "
                              "be; retry later.", code="billing_unavailable",
                              headers={"Retry-After": str(BILLING_RETRY_AFTER_S)})
        response_id = f"{self.response_prefix}-{uuid.uuid4().hex}"
        account = p.accounts.open(request_id or response_id, caller)
        if lane is not None:
            self._as_batch_line(account, lane)
        async with closes_on_failure(account):
            may_use = visibility_of(p.tenancy, caller)
            resolved = await p.resolver.resolve_request(req.model, may_use, p.tenancy.tenant(caller.tenant))
            # Routing step (api/routing): rollout arm, shadow and fallback chain.
            route = p.traffic.decide(resolved, caller.tenant, req.user, account.request_id, may_use)
            account.model, account.version = route.primary.name, route.primary.version
            tenant_cap = p.tenancy.tenant(caller.tenant).limits.max_tokens
            prepared = Prepared(await self.prepare(req, response_id, tenant_cap))
            limit_param = req.output_limit().param
            background = lane is not None and lane.background
            if not background:
                limit_headers = await p.limits.admit(caller, prepared.reserve_tokens, prepared.sequences,
                                                     limit_param, account)
                await p.admission.enter(caller, prepared.sequences, account, route.primary.manifest)
            else:
                # Slots first: a batch line waiting for capacity holds none of its tenant's concurrency or tokens.
                await p.admission.enter_background(caller, prepared.sequences, account, lane.preempt,
                                                   route.primary.manifest)
                limit_headers = await p.limits.admit(caller, prepared.reserve_tokens, prepared.sequences,
                                                     limit_param, account)
            # Load step: the first of the route's options that can serve, into the engine.
            landing = await p.loading.load(route, account)
            p.traffic.landed(account.request_id, landing.served, landing.primary_failed)
            served = landing.served
            account.model, account.version, account.route = served.name, served.version, landing.ledger_route()
            headers = {SERVED_MODEL_HEADER: served.id, **landing.headers(), **limit_headers}
            created = int(time.time())
            cache_salt = p.cache_salts.salt_of(caller.tenant)
            p.shadows.start(route, prepared.calls, cache_salt)
            calls = run_calls(self.engine, landing.adapter, prepared.calls, account, cache_salt)
            if route.rollout is not None:
                calls = p.traffic.tap(route, calls)
            if p.drift is not None and not background:  # batch lines are not live traffic
                calls = watched(calls, p.drift, served.name, served.version,
                                [(c.choice_offset, len(c.prompt_token_ids)) for c in prepared.calls])
            deltas = traced(calls, p.tracing, "engine.generate", model=served.id, tenant=caller.tenant,
                            request_id=account.request_id)
            if req.stream:
                events = self.stream_events(req, served, response_id, created, prepared.calls, deltas, account)
                stream = traced(framed_stream(events, account), p.tracing, "stream", model=served.id)
                return Reply(stream, headers, stream_account=account)
            try:
                response = await self.collect(req, served, response_id, created, prepared.calls, deltas, account)
            except asyncio.CancelledError:
                account.completion_tokens = 0  # cut before the response went out: nothing was delivered
                raise
        await account.close(200)
        return Reply(response, headers)

    def _as_batch_line(self, account: RequestAccount, lane: BatchLane) -> None:
        account.billing_key = lane.billing_key
        if not lane.background:
            return
        full_price = account.price_of
        discount = self.pipeline.prices.batch_discount(account.tenant)
        account.priority = BATCH_PRIORITY
        account.price_of = lambda p, c: full_price(p, c) * (1.0 - discount)
