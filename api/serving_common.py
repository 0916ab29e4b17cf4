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

from api.catalog import ModelCatalog, ServedModel
from api.errors import OpenAIError
from api.metrics import STATUS_CLIENT_CLOSED, UNKNOWN_MODEL, ServerMetrics
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


@dataclass
class RequestAccount:
    """Times and token counts of one HTTP request, recorded to metrics exactly once."""

    metrics: ServerMetrics
    model: str
    arrival: float = field(default_factory=time.monotonic)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None
    _closed: bool = False

    def __post_init__(self) -> None:
        self.metrics.in_flight.inc()

    def on_tokens(self, count: int) -> None:
        if count and self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.completion_tokens += count

    def close(self, status: int) -> None:
        if self._closed:
            return
        self._closed = True
        self.metrics.in_flight.dec()
        ttft = None if self.first_token_at is None else self.first_token_at - self.arrival
        self.metrics.observe(self.model, status, self.prompt_tokens, self.completion_tokens, ttft,
                             time.monotonic() - self.arrival)


@dataclass(frozen=True)
class EngineCall:
    """One prompt sent to the engine; `choice_offset` places its choices in the response."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    choice_offset: int = 0


async def run_calls(
    engine: EngineClient, served: ServedModel, calls: list[EngineCall], account: RequestAccount
) -> AsyncIterator[ChoiceDelta]:
    """Deltas of every call, interleaved as they come, with choice indexes made global.

    Raises OpenAIError on engine failure; a cancelled consumer aborts every call still running.
    """
    account.prompt_tokens = sum(len(c.prompt_token_ids) for c in calls)
    if len(calls) == 1:
        # The common case streams straight through: no pump task, no queue hop per engine step.
        async for delta in _run_one(engine, served, calls[0], account):
            yield delta
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(call: EngineCall) -> None:
        try:
            async for delta in _run_one(engine, served, call, account):
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


async def _run_one(engine: EngineClient, served: ServedModel, call: EngineCall,
                   account: RequestAccount) -> AsyncIterator[ChoiceDelta]:
    """One engine request's deltas; counts tokens, maps failures to OpenAIError, aborts if left early."""
    steps = engine.generate(call.request_id, call.prompt_token_ids, call.params, served.adapter)
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
    """SSE lines of a response, ended by [DONE]; an error after the start becomes an error event."""
    status = 200
    try:
        async for line in events:
            yield line
    except OpenAIError as e:
        status = e.status
        yield sse(e.body())
    except (asyncio.CancelledError, GeneratorExit):
        status = STATUS_CLIENT_CLOSED
        raise
    finally:
        account.close(status)
    yield SSE_DONE



class GenerationService(ABC):
    """Template for an OpenAI generation endpoint: resolve, prepare engine calls, then stream or collect.

    Subclasses only say how a request becomes engine calls and how deltas become response objects.
    """

    def __init__(self, engine: EngineClient, catalog: ModelCatalog, metrics: ServerMetrics):
        self.engine = engine
        self.catalog = catalog
        self.metrics = metrics

    @abstractmethod
    def prepare(self, req, response_id: str) -> list[EngineCall]: ...

    @abstractmethod
    def stream_events(self, req, served: ServedModel, response_id: str, created: int, calls: list[EngineCall],
                      deltas: AsyncIterator[ChoiceDelta], account: RequestAccount) -> AsyncIterator[str]: ...

    @abstractmethod
    async def collect(self, req, served: ServedModel, response_id: str, created: int, calls: list[EngineCall],
                      deltas: AsyncIterator[ChoiceDelta], account: RequestAccount) -> BaseModel: ...

    response_prefix = "cmpl"

    async def create(self, req) -> BaseModel | AsyncIterator[str]:
        account = RequestAccount(self.metrics, UNKNOWN_MODEL)
        response_id = f"{self.response_prefix}-{uuid.uuid4().hex}"
        try:
            served = self.catalog.resolve(req.model)
            account.model = served.id
            calls = self.prepare(req, response_id)
        except OpenAIError as e:
            account.close(e.status)
            raise
        created = int(time.time())
        deltas = run_calls(self.engine, served, calls, account)
        if req.stream:
            events = self.stream_events(req, served, response_id, created, calls, deltas, account)
            return framed_stream(events, account)
        status = 500
        try:
            response = await self.collect(req, served, response_id, created, calls, deltas, account)
            status = 200
            return response
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
