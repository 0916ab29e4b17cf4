"""One request's account: times, tokens and compute cost as they happen, closed exactly once into an outcome
that metrics, SLOs, the request log and the usage ledger all read."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from api.observability.outcome import STATUS_CLIENT_CLOSED, RequestOutcome
from api.observability.request_metrics import UNKNOWN  # tenant or model not known (yet)

logger = logging.getLogger(__name__)


def finish_of(status: int) -> str:
    if status == STATUS_CLIENT_CLOSED:
        return "aborted"
    if status >= 400:
        return "error"
    return "completed"


class OutcomeSink:
    """Fans one finished request out to its readers; the ledger write commits before this returns."""

    def __init__(self, readers: list[Callable[[RequestOutcome, str], None]]):
        self._readers = readers

    def record(self, outcome: RequestOutcome) -> None:
        finish = finish_of(outcome.status)
        for reader in self._readers:
            try:
                reader(outcome, finish)
            except Exception:  # one broken reader must not lose the others' record
                logger.exception("recording request %s failed in %r", outcome.request_id, reader)


@dataclass
class RequestAccount:
    """Created when a request arrives; `close` runs the cleanups (slots, reservations) then records it."""

    sink: OutcomeSink
    request_id: str
    tenant: str = UNKNOWN
    priority: str = ""
    model: str = UNKNOWN
    version: str = ""
    price_of: Callable[[int, int], float] = lambda prompt, completion: 0.0
    cost_per_token: Callable[[], float] = lambda: 0.0
    arrival: float = field(default_factory=time.monotonic)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    queue_seconds: float = 0.0
    cost_usd: float = 0.0
    first_token_at: float | None = None
    last_token_at: float | None = None
    gaps: list[float] = field(default_factory=list)
    cleanups: list[Callable[[RequestAccount], None]] = field(default_factory=list)
    closed: bool = False

    def on_tokens(self, count: int) -> None:
        """`count` tokens handed to the client now; one engine step's worth."""
        if not count:
            return
        now = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = now
            self.cost_usd += self.prompt_tokens * self.cost_per_token()
        elif self.last_token_at is not None:
            self.gaps.append(now - self.last_token_at)
        self.last_token_at = now
        self.completion_tokens += count
        self.cost_usd += count * self.cost_per_token()

    def close(self, status: int) -> RequestOutcome | None:
        if self.closed:
            return None
        self.closed = True
        for cleanup in reversed(self.cleanups):
            try:
                cleanup(self)
            except Exception:
                logger.exception("cleanup of request %s failed", self.request_id)
        now = time.monotonic()
        outcome = RequestOutcome(
            request_id=self.request_id, tenant=self.tenant, priority=self.priority, model=self.model,
            version=self.version, status=status, prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens, queue_seconds=self.queue_seconds,
            ttft_seconds=None if self.first_token_at is None else self.first_token_at - self.arrival,
            e2e_seconds=now - self.arrival, inter_token_seconds=tuple(self.gaps),
            price_usd=self.price_of(self.prompt_tokens, self.completion_tokens), cost_usd=self.cost_usd,
            finished_at=time.time(),
        )
        self.sink.record(outcome)
        return outcome
