"""Fair admission in front of the engine: a bounded number of running requests, the rest wait their turn.

`FairAdmission` holds the slot count and schedules live requests: the order is start-time fair queueing across
tenants (`FairQueue`); which tenants may start is decided here (free slots, fair shares and claims), and, with
`AdapterSlots`, which of a tenant's waiting requests starts in its turn (the adapters the engine can run
together). Idle slots for shadows are live tickets of their own pseudo-tenant (`try_acquire_idle`). Batch lines
go through its `background` lane (`api.tenancy.background_lane`, whose notes are the contract between the two).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from api.tenancy.adapter_slots import AdapterSlots
from api.tenancy.background_lane import BackgroundLane
from api.tenancy.config import AdmissionConfig
from api.tenancy.fair_queue import Entry, FairQueue
from api.tenancy.ticket import Ticket

_EPS = 1e-9  # shares are fractions of slots; compare them with slot counts with this much slack


class QueueFull(Exception):
    """The waiting room is full (HTTP 503 with Retry-After)."""

    def __init__(self, retry_after_s: float, queued: int):
        super().__init__(f"The server is overloaded: {queued} requests are already waiting. "
                         "Please retry after a short wait.")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class AdmissionStats:
    running: int
    max_running: int
    queued: int
    max_queued: int
    running_by_tenant: dict[str, int]
    queued_by_tenant: dict[str, int]
    background_running: int = 0  # of `running`: slots held by batch lines


class FairAdmission:
    """At most `max_running` slots are held; up to `max_queued` requests wait in fair order (at most
    `max_queued_per_tenant` of one tenant); more are refused. A request takes one slot per sequence it runs
    (capped at `max_running`, so any request can start on an idle engine).

    Fair shares are `max_running` split by weight among the tenants with requests running or waiting. A tenant
    under its share may take any free slot. A tenant at or over it borrows a free slot only if enough stay free
    for the other tenants' claims. A tenant's claim is the smaller of its share and its recent peak concurrency
    (the highest running + waiting since it last stayed lower for `reserve_window_s`), less what it runs, and
    only while it has requests running or waiting. So a client that keeps several requests going and sends
    the next as one finishes finds its slot still free instead of taken by a flood. A client with one request
    at a time has no claim between requests; its next request is still first in line for the next free slot.
    `reserve_window_s` 0 turns claims off (plain work-conserving fair queueing).

    Background tickets (batch lines, `background.acquire`) take slots only when no live request waits, and
    while live requests run at most `max_background_with_live` slots in all (0: none, so the engine serves the
    live requests alone). A live request that arrives preempts the background tickets over that allowance, and
    those whose slots it needs, newest first. After live traffic, background tickets wait until no live request
    has run for `background_quiet_s`, so a steady trickle of live requests is not met by batch lines restarting
    (and being preempted again) in every gap between them. Background slots count against `max_running` but not
    in any tenant's fair share.

    With `adapters` (api/tenancy/adapter_slots.py), a tenant's turn goes to its waiting request whose adapter
    is cheapest to run beside the running ones (the engine runs at most `max_loras` distinct adapters a step).

    Cancellation-safe: a waiter cancelled before its grant leaves the queue, one cancelled after its
    grant hands the slot on. Single event loop; not thread-safe.
    """

    _HOLD_SMOOTHING = 0.2

    @classmethod
    def from_config(cls, config: AdmissionConfig, max_running: int,
                    adapters: AdapterSlots | None = None) -> FairAdmission:
        """The tenants file's admission section; `max_running` is the size it resolves to
        (`LoraplexConfig.admission_size`)."""
        return cls(max_running, config.max_queued, reserve_window_s=config.reserve_window_s,
                   max_queued_per_tenant=config.max_queued_per_tenant, max_queue_wait_s=config.max_queue_wait_s,
                   max_background_with_live=config.max_batch_running_with_live,
                   background_quiet_s=config.batch_quiet_s, adapters=adapters)

    def __init__(self, max_running: int, max_queued: int, clock: Callable[[], float] = time.monotonic,
                 reserve_window_s: float = 0.0, max_queued_per_tenant: int | None = None,
                 max_queue_wait_s: float | None = None, max_background_with_live: int = 0,
                 background_quiet_s: float = 0.0, adapters: AdapterSlots | None = None):
        if max_running <= 0 or max_queued < 0 or reserve_window_s < 0 or max_background_with_live < 0:
            raise ValueError(f"need max_running > 0, max_queued >= 0 and reserve_window_s >= 0, got "
                             f"{max_running}, {max_queued}, {reserve_window_s}")
        self.max_running = max_running
        self.max_queued = max_queued
        self.max_queued_per_tenant = max_queued if max_queued_per_tenant is None else max_queued_per_tenant
        self.max_queue_wait_s = max_queue_wait_s
        self._clock = clock
        self._window = reserve_window_s
        self._queue: FairQueue[tuple[asyncio.Future, Ticket]] = FairQueue()
        self._running: Counter[str] = Counter()
        self._live_running = 0  # slots of live tickets (shadows' idle ones included)
        self._weights: dict[str, float] = {}
        self._peaks: dict[str, tuple[int, float]] = {}  # tenant -> (peak running + queued, when it was reached)
        self._wake: asyncio.TimerHandle | None = None
        self._mean_hold_s = 1.0
        self._reserving = False  # free slots are held for a waiter that needs more of them
        self._wait_listeners: list[Callable[[], None]] = []
        self._last_live = -math.inf  # when a live request last ran (clock)
        self.adapters = adapters
        self.background = BackgroundLane(self, max_background_with_live, background_quiet_s, clock, adapters)

    @property
    def running(self) -> int:
        return self._live_running + self.background.held

    # The lane's view of the live side (`background_lane.LiveSide`)

    def live_blocked(self) -> bool:
        return bool(self._queue) or self._reserving

    def live_slots(self) -> int:
        return self._live_running

    def last_live(self) -> float:
        return self._last_live

    # Live requests

    async def acquire(self, tenant: str, weight: float, slots: int = 1, adapter: str | None = None,
                      on_wait: Callable[[], None] | None = None) -> Ticket:
        """Wait for `slots` slots (one per sequence) for a request running `adapter` (a label; None: the base
        model); raises QueueFull at once when `max_queued` requests (or `max_queued_per_tenant` of this tenant's)
        already wait. `on_wait()` runs if the request has to wait (e.g. to prefetch its adapter)."""
        started = self._clock()
        ticket = Ticket(tenant, slots=max(1, min(slots, self.max_running)), adapter=adapter, enqueued_at=started)
        self._last_live = started
        self.background.yield_to(ticket.slots)
        self._weights[tenant] = weight
        self.dispatch()  # claims may have lapsed since the last event
        may_start = self._verdicts(started, joining=tenant)
        if not self._reserving and not self._queue.queued_of(tenant) and may_start(tenant, ticket.slots):
            self._grant(ticket, started)
            return ticket
        queued = len(self._queue)
        if (queued >= self.max_queued or self._queue.queued_of(tenant) >= self.max_queued_per_tenant
                or (self.max_queue_wait_s is not None and self.expected_wait(queued) > self.max_queue_wait_s)):
            self._forget_if_idle(tenant)
            raise QueueFull(self._retry_after(queued), queued)
        for listener in self._wait_listeners:  # e.g. shadows give their slots back (api/routing/shadow.py)
            listener()
        if on_wait is not None:
            on_wait()
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        entry = self._queue.push(tenant, (future, ticket), weight, ticket.slots)
        self._note_demand(tenant)
        self.dispatch()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(ticket)
            elif self._queue.remove(entry):
                self._forget_if_idle(tenant)
                self.dispatch()  # a claim may have gone with it
                self.background.wake()
            raise
        ticket.queue_seconds = ticket.granted_at - started
        return ticket

    def try_acquire_idle(self, tenant: str, slots: int, keep_free: int, adapter: str | None = None) -> Ticket | None:
        """Slots for background work, only while nobody waits, `keep_free` slots stay free after it and its
        adapter fits; never queues. Whoever holds such slots should give them back when a wait listener fires."""
        slots = max(1, min(slots, self.max_running))
        if self._queue or self.max_running - self.running - slots < keep_free:
            return None
        if self.adapters is not None and not self.adapters.fits(adapter):
            return None
        ticket = Ticket(tenant, slots=slots, adapter=adapter)
        self._grant(ticket, self._clock())
        return ticket

    def add_wait_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` runs whenever a request has to wait for a slot."""
        self._wait_listeners.append(listener)

    def release(self, ticket: Ticket) -> None:
        """Give the slot to the next waiter in fair order; releasing twice does nothing."""
        if ticket.released:
            return
        ticket.released = True
        if ticket.background:
            self.background.release(ticket)
            return
        if self.adapters is not None:
            self.adapters.stop(ticket.adapter)
        self._last_live = self._clock()
        held = self._last_live - ticket.granted_at
        self._mean_hold_s += self._HOLD_SMOOTHING * (held - self._mean_hold_s)
        self._running[ticket.tenant] -= ticket.slots
        self._live_running -= ticket.slots
        self._note_demand(ticket.tenant)
        self._forget_if_idle(ticket.tenant)
        self.dispatch()
        self.background.wake()

    def waiting_adapters(self) -> set[str]:
        """The adapter labels of the live requests waiting for a slot."""
        return {ticket.adapter for future, ticket in self._queue.waiting()
                if ticket.adapter is not None and not future.done()}

    def stats(self) -> AdmissionStats:
        return AdmissionStats(
            running=self.running, max_running=self.max_running, queued=len(self._queue),
            max_queued=self.max_queued, running_by_tenant={t: n for t, n in self._running.items() if n},
            queued_by_tenant=self._queue.queued(), background_running=self.background.held,
        )

    def _grant(self, ticket: Ticket, now: float) -> None:
        ticket.granted_at = now
        self._running[ticket.tenant] += ticket.slots
        self._live_running += ticket.slots
        if self.adapters is not None:
            self.adapters.start(ticket.adapter)
        self._note_demand(ticket.tenant)

    def dispatch(self) -> None:
        """Starts waiters in fair order. When the fairest waiter entitled to start needs more slots than are
        free, the free slots are held for it (`_reserving`) rather than given to smaller requests behind it,
        which could otherwise keep a many-sequence request waiting forever."""
        self._reserving = False
        while self.running < self.max_running and self._queue:
            now = self._clock()
            may_start = self._verdicts(now)
            entry = self._next(may_start, now)
            if entry is None:
                return
            _, (future, ticket) = self._queue.take(entry)
            if future.done():  # cancelled; its owner has not run its cleanup yet
                continue
            self._grant(ticket, now)
            future.set_result(None)

    def _next(self, may_start: Callable[[str, int], bool], now: float) -> Entry | None:
        """The waiter to start now, in the turn of the fairest tenant that may start one; None when there is
        none (and `_reserving` set when free slots are held for the fairest)."""
        head = self._queue.first(lambda tenant: may_start(tenant, 1))
        if head is None:
            self._wake_when_claims_lapse()
            return None
        future, ticket = head.item
        if future.done():
            return head
        if not may_start(head.tenant, ticket.slots):
            self._reserving = True
            return None
        if self.adapters is None:
            return head
        waiting = [e for e in self._queue.window(head.tenant, self.adapters.window) if not e.item[0].done()]
        return waiting[self.adapters.choose([e.item[1] for e in waiting], now)]

    def _forget_if_idle(self, tenant: str) -> None:
        """Shares are over tenants with demand; dropping idle ones keeps each verdict O(active tenants), not
        O(every tenant seen). Their peaks stay: a client back within the window still has its claim."""
        if self._demand(tenant) == 0:
            self._weights.pop(tenant, None)

    def _demand(self, tenant: str) -> int:
        return self._running[tenant] + self._queue.queued_of(tenant)

    def _note_demand(self, tenant: str) -> None:
        now, demand = self._clock(), self._demand(tenant)
        peak, at = self._peaks.get(tenant, (0, now))
        if demand >= peak or now - at > self._window:
            self._peaks[tenant] = (demand, now)

    def _claim(self, tenant: str, share: float, now: float) -> int:
        """Free slots held for `tenant`: what is left of min(share, recent peak) after what it runs."""
        if self._window <= 0:
            return 0
        peak, at = self._peaks.get(tenant, (0, now))
        recent = max(peak, self._demand(tenant)) if now - at <= self._window else self._demand(tenant)
        return max(0, math.floor(min(share, recent) + _EPS) - self._running[tenant])

    def _verdicts(self, now: float, joining: str | None = None) -> Callable[[str, int], bool]:
        """Whether a tenant may start a request of so many slots now. Shares and claims are computed once here,
        over the tenants with requests running or waiting (and `joining`, a tenant about to ask)."""
        free = self.max_running - self.running
        if free <= 0:
            return lambda tenant, slots: False
        weights = {t: w for t, w in self._weights.items() if t == joining or self._demand(t) > 0}
        total = sum(weights.values())
        shares = {t: self.max_running * w / total for t, w in weights.items()}
        claims = {t: self._claim(t, share, now) for t, share in shares.items()}
        all_claims = sum(claims.values())

        def may_start(tenant: str, slots: int) -> bool:
            if slots > free:
                return False
            if self._running[tenant] < shares[tenant] - _EPS:
                return True
            return free - slots >= all_claims - claims[tenant]

        return may_start

    def _wake_when_claims_lapse(self) -> None:
        """Waiters blocked only by other tenants' claims get another look once the claims' window has passed."""
        if self._window <= 0 or self._wake is not None:
            return
        try:
            self._wake = asyncio.get_running_loop().call_later(self._window, self._on_wake)
        except RuntimeError:  # no running loop: only the next acquire or release dispatches
            return

    def _on_wake(self) -> None:
        self._wake = None
        self.dispatch()

    def expected_wait(self, queued: int) -> float:
        """Rough wait behind `queued` requests: each slot frees once per mean hold time."""
        return self._mean_hold_s * (queued + 1) / self.max_running

    def _retry_after(self, queued: int) -> float:
        return max(1.0, self.expected_wait(queued))
