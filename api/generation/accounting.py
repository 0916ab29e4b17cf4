"""One request's account: times, tokens and compute cost as they happen, closed exactly once into an outcome
that metrics, SLOs, the request log and the usage ledger all read."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

from prometheus_client import Gauge

from api.auth import Caller
from api.errors import OpenAIError
from api.lifecycle import Lifecycle
from api.observability.outcome import STATUS_CLIENT_CLOSED, UNKNOWN, RequestOutcome
from api.tenancy.config import TenancyConfig
from api.tenancy.pricing import ComputeMeter, PriceTable

logger = logging.getLogger(__name__)


def finish_of(status: int) -> str:
    if status == STATUS_CLIENT_CLOSED:
        return "aborted"
    if status >= 400:
        return "error"
    return "completed"


Reader = Callable[[RequestOutcome, str], None]
BatchReader = Callable[[list[tuple[RequestOutcome, str]]], None]
WRITER_IDLE_S = 10.0  # an idle writer thread ends after this; the next outcome starts one


class OutcomeSink:
    """Fans finished requests out to their readers in one writer thread, off the event loop. The requests that
    finish while it writes are written together: each batch reader (the ledger) takes them in one call, one
    commit, so a burst of stream ends costs one commit and one wake-up of the loop. `submit`'s future is done
    once every reader has its record (the ledger's row is committed)."""

    def __init__(self, readers: list[Reader], batch_readers: Sequence[BatchReader] = ()):
        self._readers = readers
        self._batch_readers = list(batch_readers)
        self._queue: queue.SimpleQueue[tuple[RequestOutcome, asyncio.AbstractEventLoop, asyncio.Future]] = (
            queue.SimpleQueue())
        self._writer: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, outcome: RequestOutcome) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._queue.put((outcome, loop, done))
        with self._start_lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write, name="outcome-writer", daemon=True)
                self._writer.start()
        return done

    def _record(self, outcomes: list[RequestOutcome]) -> None:
        rows = [(outcome, finish_of(outcome.status)) for outcome in outcomes]
        for batch_reader in self._batch_readers:
            try:
                batch_reader(rows)
            except Exception:  # one broken reader must not lose the others' record
                logger.exception("recording requests %s failed in %r", [o.request_id for o in outcomes],
                                 batch_reader)
        for outcome, finish in rows:
            for reader in self._readers:
                try:
                    reader(outcome, finish)
                except Exception:
                    logger.exception("recording request %s failed in %r", outcome.request_id, reader)

    def _write(self) -> None:
        """The writer thread's loop: each pass takes every outcome queued so far."""
        while True:
            try:
                batch = [self._queue.get(timeout=WRITER_IDLE_S)]
            except queue.Empty:
                with self._start_lock:
                    if self._queue.empty():
                        self._writer = None
                        return
                continue
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._record([outcome for outcome, _, _ in batch])
            waiting: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
            for _, loop, done in batch:
                waiting.setdefault(loop, []).append(done)
            for loop, futures in waiting.items():
                with suppress(RuntimeError):  # a loop closed meanwhile: nobody waits on it
                    loop.call_soon_threadsafe(_set_done, futures)


def _set_done(futures: list[asyncio.Future]) -> None:
    for done in futures:
        if not done.done():
            done.set_result(None)


@dataclass
class RequestAccount:
    """Created when a request arrives; `close` runs the cleanups (slots, reservations), records the outcome in
    a worker thread (the ledger's commit stays off the event loop), then runs the `after_record` callbacks."""

    sink: OutcomeSink
    request_id: str
    tenant: str = UNKNOWN
    priority: str = ""
    model: str = UNKNOWN
    version: str = ""
    route: str = ""  # the routing step's decision, as the ledger records it (api/routing/traffic.py)
    price_of: Callable[[int, int], float] = lambda prompt, completion: 0.0
    cost_per_token: Callable[[], float] = lambda: 0.0
    arrival: float = field(default_factory=time.monotonic)
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, found in the engine's prefix cache
    completion_tokens: int = 0
    queue_seconds: float = 0.0
    cost_usd: float = 0.0
    first_token_at: float | None = None
    last_token_at: float | None = None
    gaps: list[float] = field(default_factory=list)
    cleanups: list[Callable[[RequestAccount], None]] = field(default_factory=list)
    after_record: list[Callable[[], None]] = field(default_factory=list)
    closed: bool = False
    # Queued work's ledger key (a batch line's, an async job's): the attempt that succeeds is billed under it, at
    # most once however often the work is resumed; an attempt that ends otherwise leaves no ledger row.
    billing_key: str | None = None

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

    async def close(self, status: int) -> RequestOutcome | None:
        """Once: gives back what the request took, records it, returns the outcome (None when already closed).
        The record runs shielded, so a second cancellation of the closing task cannot lose it."""
        outcome = self.finish(status)
        if outcome is None:
            return None
        record = self.sink.submit(outcome)
        # After the record, whether or not this task is still waiting for it (a shutdown may cancel it again).
        record.add_done_callback(lambda done: self._recorded())
        await asyncio.shield(record)
        return outcome

    def _recorded(self) -> None:
        for callback in self.after_record:
            callback()

    def finish(self, status: int) -> RequestOutcome | None:
        """The synchronous half of `close`: cleanups and the outcome, not yet recorded."""
        if self.closed:
            return None
        self.closed = True
        for cleanup in reversed(self.cleanups):
            try:
                cleanup(self)
            except Exception:
                logger.exception("cleanup of request %s failed", self.request_id)
        now = time.monotonic()
        request_id, billing = self.request_id, "row"
        if self.billing_key is not None:
            request_id, billing = (self.billing_key, "once") if status == 200 else (self.request_id, "none")
        outcome = RequestOutcome(
            request_id=request_id, tenant=self.tenant, priority=self.priority, model=self.model,
            version=self.version, status=status, prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens, queue_seconds=self.queue_seconds,
            ttft_seconds=None if self.first_token_at is None else self.first_token_at - self.arrival,
            e2e_seconds=now - self.arrival, inter_token_seconds=tuple(self.gaps),
            price_usd=self.price_of(self.prompt_tokens, self.completion_tokens), cost_usd=self.cost_usd,
            finished_at=time.time(), route=self.route, billing=billing, attempt_id=self.request_id,
        )
        return outcome


def failure_status(error: BaseException) -> int:
    """The status a request ends with when `error` escapes its handling."""
    if isinstance(error, OpenAIError):
        return error.status
    if isinstance(error, asyncio.CancelledError):
        return STATUS_CLIENT_CLOSED
    return 500


@asynccontextmanager
async def closes_on_failure(account: RequestAccount) -> AsyncIterator[RequestAccount]:
    """Whatever escapes the block (an error, a cancellation, anything) closes the account with its status
    before it propagates; a block that ends normally leaves the account open for whoever finishes it."""
    try:
        yield account
    except BaseException as e:
        await account.close(failure_status(e))
        raise


class Accounts:
    """Opens the account of each generation request: the tenant's prices and compute meter, the in-flight
    gauge and the drain count, each given back when the account closes."""

    def __init__(self, sink: OutcomeSink, tenancy: TenancyConfig, prices: PriceTable, meter: ComputeMeter,
                 in_flight: Gauge, lifecycle: Lifecycle):
        self._sink = sink
        self._tenancy = tenancy
        self._prices = prices
        self._meter = meter
        self._in_flight = in_flight
        self._lifecycle = lifecycle

    def open(self, request_id: str, caller: Caller) -> RequestAccount:
        tenant = self._tenancy.tenant(caller.tenant)
        account = RequestAccount(self._sink, request_id, tenant=caller.tenant, priority=tenant.priority,
                                 cost_per_token=lambda: self._meter.usd_per_token)
        account.price_of = lambda p, c: self._prices.price(caller.tenant, account.model, p, c)
        self._in_flight.inc()
        self._lifecycle.enter()
        # After the record: a request stops counting as in flight once its outcome is in the metrics and the
        # ledger, and shutdown waits for the drain count to reach zero before it closes the ledger.
        account.after_record.append(self._in_flight.dec)
        account.after_record.append(self._lifecycle.leave)
        return account
