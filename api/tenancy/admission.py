"""Fair admission in front of the engine: a bounded number of running requests, the rest wait their turn.

The order is start-time fair queueing across tenants: each waiting request gets the tag
max(virtual time, its tenant's last finish); the tenant's last finish moves on by cost / weight; the
smallest tag goes first (ties by arrival) and the virtual time becomes its tag. A tenant that floods the
queue only pushes its own tags out, so a newcomer is served within one round, and over time tenants
get slots in proportion to their weights.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


@dataclass(order=True)
class _Entry(Generic[T]):
    tag: float
    seq: int
    tenant: str = field(compare=False)
    finish: float = field(compare=False)
    item: T = field(compare=False)
    live: bool = field(default=True, compare=False)


class FairQueue(Generic[T]):
    """Start-time fair queueing over per-tenant FIFOs. Pure; no clock, no asyncio."""

    def __init__(self) -> None:
        self._heap: list[_Entry[T]] = []
        self._seq = itertools.count()
        self._virtual_time = 0.0
        self._last_finish: dict[str, float] = {}
        self._queued: Counter[str] = Counter()

    def __len__(self) -> int:
        return sum(self._queued.values())

    @property
    def virtual_time(self) -> float:
        return self._virtual_time

    def queued(self) -> dict[str, int]:
        return {tenant: n for tenant, n in self._queued.items() if n}

    def push(self, tenant: str, item: T, weight: float, cost: float = 1.0) -> _Entry[T]:
        """Enqueue; the returned handle can be passed to `remove`."""
        if weight <= 0 or cost <= 0:
            raise ValueError(f"weight and cost must be positive, got weight={weight}, cost={cost}")
        tag = max(self._virtual_time, self._last_finish.get(tenant, 0.0))
        entry = _Entry(tag, next(self._seq), tenant, tag + cost / weight, item)
        self._last_finish[tenant] = entry.finish
        self._queued[tenant] += 1
        heapq.heappush(self._heap, entry)
        return entry

    def pop(self) -> tuple[str, T]:
        """The waiting item with the smallest tag; IndexError when empty."""
        while self._heap:
            entry = heapq.heappop(self._heap)
            if entry.live:
                entry.live = False
                self._queued[entry.tenant] -= 1
                self._virtual_time = entry.tag
                return entry.tenant, entry.item
        raise IndexError("pop from an empty FairQueue")

    def remove(self, entry: _Entry[T]) -> bool:
        """Drop a waiting item; False if it already left. The heap slot is reclaimed lazily by `pop`."""
        if not entry.live:
            return False
        entry.live = False
        self._queued[entry.tenant] -= 1
        if self._last_finish.get(entry.tenant) == entry.finish:
            # The tenant's newest item left: give back the share it had booked.
            self._last_finish[entry.tenant] = entry.tag
        return True


class QueueFull(Exception):
    """The waiting room is full (HTTP 503 with Retry-After)."""

    def __init__(self, retry_after_s: float, queued: int):
        super().__init__(f"The server is overloaded: {queued} requests are already waiting. "
                         "Please retry after a short wait.")
        self.retry_after_s = retry_after_s


@dataclass
class Ticket:
    """One engine slot, held from grant to `FairAdmission.release`."""

    tenant: str
    queue_seconds: float = 0.0
    granted_at: float = 0.0
    released: bool = False


@dataclass(frozen=True)
class AdmissionStats:
    running: int
    max_running: int
    queued: int
    max_queued: int
    running_by_tenant: dict[str, int]
    queued_by_tenant: dict[str, int]


class FairAdmission:
    """At most `max_running` requests hold a slot; up to `max_queued` wait in fair order; more are refused.

    Cancellation-safe: a waiter cancelled before its grant leaves the queue, one cancelled after its
    grant hands the slot on. Single event loop; not thread-safe.
    """

    _HOLD_SMOOTHING = 0.2

    def __init__(self, max_running: int, max_queued: int, clock: Callable[[], float] = time.monotonic):
        if max_running <= 0 or max_queued < 0:
            raise ValueError(f"need max_running > 0 and max_queued >= 0, got {max_running}, {max_queued}")
        self.max_running = max_running
        self.max_queued = max_queued
        self._clock = clock
        self._queue: FairQueue[tuple[asyncio.Future, Ticket]] = FairQueue()
        self._running: Counter[str] = Counter()
        self._mean_hold_s = 1.0

    @property
    def running(self) -> int:
        return sum(self._running.values())

    async def acquire(self, tenant: str, weight: float, cost: float = 1.0) -> Ticket:
        """Wait for a slot; raises QueueFull at once when `max_queued` requests already wait."""
        started = self._clock()
        ticket = Ticket(tenant)
        if self.running < self.max_running and not self._queue:
            self._grant(ticket, started)
            return ticket
        queued = len(self._queue)
        if queued >= self.max_queued:
            raise QueueFull(self._retry_after(queued), queued)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        entry = self._queue.push(tenant, (future, ticket), weight, cost)
        self._dispatch()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(ticket)
            else:
                self._queue.remove(entry)
            raise
        ticket.queue_seconds = ticket.granted_at - started
        return ticket

    def release(self, ticket: Ticket) -> None:
        """Give the slot to the next waiter in fair order; releasing twice does nothing."""
        if ticket.released:
            return
        ticket.released = True
        held = self._clock() - ticket.granted_at
        self._mean_hold_s += self._HOLD_SMOOTHING * (held - self._mean_hold_s)
        self._running[ticket.tenant] -= 1
        self._dispatch()

    def stats(self) -> AdmissionStats:
        return AdmissionStats(
            running=self.running, max_running=self.max_running, queued=len(self._queue),
            max_queued=self.max_queued, running_by_tenant={t: n for t, n in self._running.items() if n},
            queued_by_tenant=self._queue.queued(),
        )

    def _grant(self, ticket: Ticket, now: float) -> None:
        ticket.granted_at = now
        self._running[ticket.tenant] += 1

    def _dispatch(self) -> None:
        while self.running < self.max_running and self._queue:
            _, (future, ticket) = self._queue.pop()
            if future.done():  # cancelled; its owner has not run its cleanup yet
                continue
            self._grant(ticket, self._clock())
            future.set_result(None)

    def _retry_after(self, queued: int) -> float:
        """Rough wait for the queue to move by one place per slot: mean hold time times queue depth."""
        return max(1.0, self._mean_hold_s * (queued + 1) / self.max_running)
