"""Engine fan-out: a request's prompts run as engine calls, their deltas merged into one stream.

Each call's tokens are counted on the request's account as they arrive; a consumer that stops early
(disconnect, error) aborts every call still running in the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from vllm import SamplingParams

from adapters.identity import LocatedAdapter
from api.errors import OpenAIError
from api.generation.accounting import RequestAccount
from engine.types import (
    ChoiceDelta,
    EngineClient,
    EngineDeadError,
    EngineError,
    EngineRequestError,
    PositionLogprobs,
)

logger = logging.getLogger(__name__)
# vLLM's finish reason for a request the engine could not complete (its output so far is not an answer).
ENGINE_ERROR_FINISH = "error"


def engine_failure(e: Exception) -> OpenAIError:
    if isinstance(e, EngineRequestError):
        return OpenAIError(400, str(e), code="invalid_value")
    if isinstance(e, EngineDeadError):
        return OpenAIError(503, "The engine is not running.", code="engine_dead")
    return OpenAIError(500, "The engine failed while generating this response.", code="engine_error")


@dataclass(frozen=True)
class EngineCall:
    """One prompt sent to the engine; `choice_offset` places its choices in the response. `discard_output`: the
    caller wants none of the output (an echo with `max_tokens` 0; the engine generates at least one token),
    so it is neither passed on nor counted."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    choice_offset: int = 0
    discard_output: bool = False


def run_calls(
    engine: EngineClient, adapter: LocatedAdapter | None, calls: list[EngineCall], account: RequestAccount,
    cache_salt: str | None = None,
) -> AsyncIterator[ChoiceDelta]:
    """Deltas of every call, interleaved as they come, with choice indexes made global. `cache_salt` keeps the
    calls' prefix-cache blocks apart from other tenants' (`cache_salt.CacheSalts`).

    Raises OpenAIError on engine failure; a cancelled consumer aborts every call still running.
    """
    account.prompt_tokens = sum(len(c.prompt_token_ids) for c in calls)
    if len(calls) == 1:
        # The common case streams straight through: no pump task, no queue hop per engine step.
        return _run_one(engine, adapter, calls[0], account, cache_salt)
    return _run_many(engine, adapter, calls, account, cache_salt)


async def _run_many(engine: EngineClient, adapter: LocatedAdapter | None, calls: list[EngineCall],
                    account: RequestAccount, cache_salt: str | None) -> AsyncIterator[ChoiceDelta]:
    queue: asyncio.Queue[ChoiceDelta | OpenAIError | None] = asyncio.Queue()

    async def pump(call: EngineCall) -> None:
        try:
            async for delta in _run_one(engine, adapter, call, account, cache_salt):
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


async def engine_deltas(engine: EngineClient, adapter: LocatedAdapter | None, call: EngineCall,
                        cache_salt: str | None) -> AsyncIterator[ChoiceDelta]:
    """One engine request's deltas: the one engine call of every run (live, batch, graph, shadow). Maps failures
    to OpenAIError and aborts the request in the engine if the consumer leaves early."""
    steps = engine.generate(call.request_id, call.prompt_token_ids, call.params, adapter, cache_salt)
    finished = False
    try:
        async for step in steps:
            for delta in step:
                if delta.finish_reason == ENGINE_ERROR_FINISH:  # the request's other choices are aborted below
                    raise EngineError(f"the engine ended request {call.request_id} with finish reason 'error'")
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


async def _run_one(engine: EngineClient, adapter: LocatedAdapter | None, call: EngineCall,
                   account: RequestAccount, cache_salt: str | None) -> AsyncIterator[ChoiceDelta]:
    """`engine_deltas`, counted on the request's account."""
    cached_counted = False
    async for delta in engine_deltas(engine, adapter, call, cache_salt):
        if call.discard_output:
            delta = dataclasses.replace(delta, text="", token_ids=(), logprobs=None)
        account.on_tokens(len(delta.token_ids))
        if not cached_counted:
            account.cached_prompt_tokens += delta.cached_prompt_tokens
            cached_counted = True
        yield delta


def delta_with_offset(delta: ChoiceDelta, offset: int) -> ChoiceDelta:
    if offset == 0:
        return delta
    return dataclasses.replace(delta, index=delta.index + offset)


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


async def collected_deltas(deltas: AsyncIterator[ChoiceDelta]) -> AsyncIterator[ChoiceDelta]:
    """Each choice's deltas joined into one, yielded when that choice finishes (for output that means something
    only whole)."""
    pending: dict[int, tuple[CollectedChoice, bool]] = {}
    async for d in deltas:
        c, has_logprobs = pending.get(d.index, (CollectedChoice(), False))
        c.text += d.text
        c.token_ids.extend(d.token_ids)
        c.logprobs.extend(d.logprobs or ())
        pending[d.index] = (c, has_logprobs or d.logprobs is not None)
        if d.finish_reason is not None:
            del pending[d.index]
            yield ChoiceDelta(index=d.index, text=c.text, token_ids=tuple(c.token_ids),
                              logprobs=tuple(c.logprobs) if has_logprobs or d.logprobs is not None else None,
                              finish_reason=d.finish_reason)
