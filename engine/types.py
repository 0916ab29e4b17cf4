"""What the engine hands to the HTTP layer: small plain types, so serving code never touches vLLM outputs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from adapters.identity import LocatedAdapter

if TYPE_CHECKING:  # serving code builds SamplingParams; this module stays importable without vLLM
    from vllm import SamplingParams


class EngineError(Exception):
    """The engine failed while running a request (the request is lost, the server may still serve)."""


class EngineDeadError(EngineError):
    """The engine process is gone; nothing more can be served."""


class EngineRequestError(ValueError):
    """The engine refused a request as invalid."""


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    token: str
    logprob: float


@dataclass(frozen=True)
class PositionLogprobs:
    """The sampled token's logprob and the top alternatives at one output position."""

    chosen: TokenLogprob
    top: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class ChoiceDelta:
    """New output of one choice since the previous delta."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[PositionLogprobs, ...] | None = None
    finish_reason: str | None = None
    cached_prompt_tokens: int = 0  # prompt tokens the engine found in its prefix cache (whole request)
    # Asked with `prompt_logprobs`: each prompt position's (the first has none), on the request's first deltas.
    prompt_logprobs: tuple[PositionLogprobs | None, ...] | None = None


@dataclass
class EngineLoad:
    """Last scheduler snapshot reported by the engine core."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    steps: int = 0
    generation_tokens: int = 0  # since start, including those of requests later aborted
    running_by_adapter: dict[str, int] = field(default_factory=dict)  # engine adapter name -> running requests
    # ... -> requests in the engine without a first output yet (queued, waiting for a slot, or in prefill)
    waiting_by_adapter: dict[str, int] = field(default_factory=dict)


class EngineClient(Protocol):
    """What the HTTP layer needs from an engine; `LoraplexEngine` is the real one."""

    model_id: str
    max_model_len: int

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def tokenizer(self): ...

    def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, adapter: LocatedAdapter | None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[list[ChoiceDelta]]: ...

    async def abort(self, request_id: str) -> None: ...

    def is_alive(self) -> bool: ...

    def load(self) -> EngineLoad: ...

    def num_unfinished_requests(self) -> int: ...
