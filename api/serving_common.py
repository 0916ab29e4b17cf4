"""What chat and completions share: one engine request's accounting, SSE framing and stream merging."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from pydantic import BaseModel
from vllm import SamplingParams

from adapters.local import LocalAdapter
from api.accounting import RequestAccount
from api.catalog import ModelCatalog, ServedModel
from api.errors import OpenAIError
from api.gate import Caller, Gate
from api.lifecycle import Lifecycle
from api.observability.outcome import STATUS_CLIENT_CLOSED
from api.protocol import Usage
from engine.types import ChoiceDelta, EngineClient, EngineDeadError, EngineRequestError, PositionLogprobs

logger = logging.getLogger(__name__)

SSE_DONE = "data: [DONE]\n\n"


def sse(payload: BaseModel | dict) -> str:
    body = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {body}\n\n"


def engine_failure(e: Exception) -> OpenAIError:
    if isinstance(e, EngineRequestError):
        return OpenAIError(400, str(e), code="invalid_value")
    if isinstance(e, EngineDeadError):
        return OpenAIError(503, "The engine is not running.", code="engine_dead")
    return OpenAIError(500, "The engine failed while generating this response.", code="engine_error")


@dataclass(frozen=True)
class EngineCall:
    """One prompt sent to the engine; `choice_offset` places its choices in the response."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    choice_offset: int = 0


async def run_calls(
    engine: EngineClient, adapter: LocalAdapter | None, calls: list[EngineCall], account: RequestAccount
) -> AsyncIterator[ChoiceDelta]:
    """Deltas of every call, interleaved as they come, with choice indexes made global.

    Raises OpenAIError on engine failure; a cancelled consumer aborts every call still running.
    """
    account.prompt_tokens = sum(len(c.prompt_token_ids) for c in calls)
    if len(calls) == 1:
        # The common case streams straight through: no pump task, no queue hop per engine step.
        async for delta in _run_one(engine, adapter, calls[0], account):
            yield delta
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(call: EngineCall) -> None:
        try:
            async for delta in _run_one(engine, adapter, call, account):
                await queue.put(delta_with_offset(delta, call.choice_offset))
            await queue.put(None)
        except OpenAIError as e:  # handed to the consumer, which raises it in the request's context
            await queue.put(e)

    tasks = [asyncio.create_task(pump(c)) for c in calls]
    pending = len(tasks)
    try:
        while pending:
            item = await queue.get()
            if item is None:
                pending -= 1
            elif isinstance(item, OpenAIError):
                raise item
            else:
                yield item
    finally:
        # Cancelling a pump closes its _run_one, which aborts that call in the engine.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _run_one(engine: EngineClient, adapter: LocalAdapter | None, call: EngineCall,
                   account: RequestAccount) -> AsyncIterator[ChoiceDelta]:
    """One engine request's deltas; counts tokens, maps failures to OpenAIError, aborts if left early."""
    steps = engine.generate(call.request_id, call.prompt_token_ids, call.params, adapter)
    finished = False
    try:
        async for step in steps:
            for delta in step:
                account.on_tokens(len(delta.token_ids))
                yield delta
        finished = True
    except OpenAIError:
        raise
    except Exception as e:
        logger.error("engine failure: %r", e, exc_info=e)
        raise engine_failure(e) from e
    finally:
        if not finished:
            await steps.aclose()
            await engine.abort(call.request_id)


def delta_with_offset(delta: ChoiceDelta, offset: int) -> ChoiceDelta:
    if offset == 0:
        return delta
    return ChoiceDelta(index=delta.index + offset, text=delta.text, token_ids=delta.token_ids,
                       logprobs=delta.logprobs, finish_reason=delta.finish_reason)


async def framed_stream(events: AsyncIterator[str], account: RequestAccount) -> AsyncIterator[str]:
    """SSE lines of a response, ended by [DONE]; an error after the start becomes an error event.

    The account closes (and the usage ledger commits) before [DONE], the response's last bytes.
    """
    status = STATUS_CLIENT_CLOSED
    try:
        try:
            async for line in events:
                yield line
            status = 200
        except OpenAIError as e:
            status = e.status
            yield sse(e.body())
    finally:
        account.close(status)
    yield SSE_DONE


def traced(items: AsyncIterator, tracing, name: str, **attrs) -> AsyncIterator:
    """`items`, inside one span from the first item asked for to the last. Without tracing, `items` itself:
    no extra generator hop per engine step."""
    if not tracing.enabled:
        return items
    return _traced(items, tracing, name, attrs)


async def _traced(items: AsyncIterator, tracing, name: str, attrs: dict) -> AsyncIterator:
    with tracing.span(name, **attrs) as span:
        count = 0
        async for item in items:
            count += 1
            yield item
        span.set_attribute("items", count)


@dataclass
class Reply:
    """A response body (an object, or SSE lines) and the headers to send with it."""

    body: BaseModel | AsyncIterator[str]
    headers: dict[str, str]


SERVED_MODEL_HEADER = "x-loraplex-model"


class GenerationService(ABC):
    """Template for an OpenAI generation endpoint: resolve, prepare engine calls, then stream or collect.

    Subclasses only say how a request becomes engine calls and how deltas become response objects.
    """

    def __init__(self, engine: EngineClient, catalog: ModelCatalog, gate: Gate, new_account, lifecycle: Lifecycle):
        self.engine = engine
        self.catalog = catalog
        self.gate = gate
        self.new_account = new_account
        self.lifecycle = lifecycle

    @abstractmethod
    def prepare(self, req, response_id: str, cap: int | None) -> list[EngineCall]:
        """Engine calls of the request; `cap` bounds each call's max_tokens (the tenant's limit)."""

    @abstractmethod
    def stream_events(self, req, served: ServedModel, response_id: str, created: int, calls: list[EngineCall],
                      deltas: AsyncIterator[ChoiceDelta], account: RequestAccount) -> AsyncIterator[str]: ...

    @abstractmethod
    async def collect(self, req, served: ServedModel, response_id: str, created: int, calls: list[EngineCall],
                      deltas: AsyncIterator[ChoiceDelta], account: RequestAccount) -> BaseModel: ...

    response_prefix = "cmpl"

    async def create(self, req, caller: Caller, request_id: str) -> Reply:
        """Resolves, admits and runs the request. The account closes exactly once on every path."""
        if self.lifecycle.draining:
            raise OpenAIError(503, "The server is shutting down.", code="draining")
        response_id = f"{self.response_prefix}-{uuid.uuid4().hex}"
        account: RequestAccount = self.new_account(request_id or response_id, caller)
        self.lifecycle.enter()
        account.cleanups.append(lambda a: self.lifecycle.leave())
        try:
            served = self.catalog.resolve(req.model, self.gate.may_use(caller))
            account.model, account.version = served.name, served.version
            cap = self.gate.max_tokens(caller, req.output_limit())
            calls = self.prepare(req, response_id, cap)
            reserve = sum(len(c.prompt_token_ids) + c.params.max_tokens * c.params.n for c in calls)
            adapter = await self.gate.enter(caller, served, account, reserve)
        except OpenAIError as e:
            account.close(e.status)
            raise
        except asyncio.CancelledError:
            account.close(STATUS_CLIENT_CLOSED)
            raise
        headers = {SERVED_MODEL_HEADER: served.id, **self.gate.limit_headers(caller)}
        created = int(time.time())
        tracing = self.gate.tracing
        deltas = traced(run_calls(self.engine, adapter, calls, account), tracing, "engine.generate",
                        model=served.id, tenant=caller.tenant, request_id=account.request_id)
        if req.stream:
            events = self.stream_events(req, served, response_id, created, calls, deltas, account)
            return Reply(traced(framed_stream(events, account), tracing, "stream", model=served.id), headers)
        status = 500
        try:
            response = await self.collect(req, served, response_id, created, calls, deltas, account)
            status = 200
            return Reply(response, headers)
        except OpenAIError as e:
            status = e.status
            raise
        except asyncio.CancelledError:
            status = STATUS_CLIENT_CLOSED
            raise
        finally:
            account.close(status)


def usage_of(account: RequestAccount) -> Usage:
    return Usage(prompt_tokens=account.prompt_tokens, completion_tokens=account.completion_tokens,
                 total_tokens=account.prompt_tokens + account.completion_tokens)


@dataclass
class CollectedChoice:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    finish_reason: str | None = None


async def collect_choices(deltas: AsyncIterator[ChoiceDelta], num_choices: int) -> list[CollectedChoice]:
    """Joins each choice's deltas into its whole output."""
    choices = [CollectedChoice() for _ in range(num_choices)]
    async for d in deltas:
        c = choices[d.index]
        c.text += d.text
        c.token_ids.extend(d.token_ids)
        c.logprobs.extend(d.logprobs or ())
        c.finish_reason = d.finish_reason or c.finish_reason
    return choices
