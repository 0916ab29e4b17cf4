"""`echo` on /v1/completions: each choice starts with its prompt and, when log-probabilities were asked, so do
they (the prompt's first position has none: nothing precedes it). Pure, apart from the deltas it reads."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from api.generation.fanout import EngineCall
from api.openai.protocol import CompletionRequest
from engine.types import ChoiceDelta, PositionLogprobs

# A prompt token without a log-probability (the first), as its text.
EchoPosition = PositionLogprobs | str


@dataclass(frozen=True)
class Piece:
    """One delta as the client sees it: its text and its log-probability positions (None: not asked)."""

    delta: ChoiceDelta
    text: str
    positions: tuple[EchoPosition, ...] | None


def prompt_texts(req: CompletionRequest, calls: list[EngineCall], tokenizer) -> list[str]:
    """Each call's prompt as text: as sent, or decoded from the token ids sent."""
    p = req.prompt
    if isinstance(p, str):
        return [p]
    if all(isinstance(x, str) for x in p):
        return list(p)
    return [tokenizer.decode(c.prompt_token_ids) for c in calls]


def _prompt_positions(delta: ChoiceDelta, call: EngineCall, tokenizer) -> tuple[EchoPosition, ...]:
    positions = delta.prompt_logprobs or ()
    return tuple(tokenizer.decode([call.prompt_token_ids[0]]) if p is None else p for p in positions)


async def pieces(req: CompletionRequest, calls: list[EngineCall], deltas: AsyncIterator[ChoiceDelta],
                 tokenizer) -> AsyncIterator[Piece]:
    """The deltas, each choice's first one led by its prompt when the request asked for `echo`."""
    asked = req.logprobs is not None
    if not req.echo:
        async for d in deltas:
            yield Piece(d, d.text, d.logprobs if asked else None)
        return
    texts = prompt_texts(req, calls, tokenizer)
    # vLLM sends a call's prompt log-probabilities once, with its first step: kept for its other choices.
    prompt_positions: dict[int, tuple[EchoPosition, ...]] = {}
    echoed: set[int] = set()
    async for d in deltas:
        call_index = d.index // req.n
        if d.prompt_logprobs is not None:
            prompt_positions[call_index] = _prompt_positions(d, calls[call_index], tokenizer)
        if d.index in echoed:
            yield Piece(d, d.text, d.logprobs if asked else None)
            continue
        echoed.add(d.index)
        positions = (*prompt_positions.get(call_index, ()), *(d.logprobs or ())) if asked else None
        yield Piece(d, texts[call_index] + d.text, positions)
