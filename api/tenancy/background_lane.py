"""The background lane of admission: batch lines take engine slots only where live traffic leaves them.

Its contract with the live side (`FairAdmission`, through `LiveSide`):
- The live side owns the slot count (`max_running`) and the live tickets; the lane owns the background tickets
  and counts their slots in `held`. Every slot is held by exactly one side.
- A background ticket starts only when no live request waits and no free slots are held for one
  (`LiveSide.live_blocked`), enough slots are free, and either no live request has run for `quiet_s` or the
  background slots stay within `max_with_live`.
- A live request that arrives calls `yield_to(slots)` before it is admitted: the newest background tickets are
  preempted (their `preempt` called once; their holders then release) until the rest fit within `max_with_live`
  and the arrival's slots are free or being given back.
- Whenever slots come free on either side, `wake()` lets the background waiters look again; when the lane gives
  slots back it calls `LiveSide.dispatch()` first, so live waiters start before background ones.
Single event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from api.tenancy.adapter_slots import AdapterSlots
from api.tenancy.ticket import Ticket


class LiveSide(Protocol):
    max_running: int

    def live_blocked(self) -> bool: ...

    def live_slots(self) -> int: ...

    def last_live(self) -> float: ...

    def dispatch(self) -> None: ...


class BackgroundLane:
    def __init__(self, live: LiveSide, max_with_live: int, quiet_s: float, clock: Callable[[], float],
                 adapters: AdapterSlots | None = None):
        self._live = live
        self.max_with_live = max_with_live
        self.quiet_s = quiet_s
        self._clock = clock
        self._adapters = adapters
        self.held = 0  # slots of the granted background tickets
        self._tickets: list[Ticket] = []  # granted, in grant order
        self._waiters: list[asyncio.Future] = []
        self._quiet_wake: asyncio.TimerHandle | None = None

    async def acquire(self, tenant: str, slots: int, preempt: Callable[[], None],
                      adapter: str | None = None) -> Ticket:
        """Waits until `slots` slots are free of live demand (see the module notes), then holds them. `preempt`
        is called at most once, when a live request needs them back: the holder must then release."""
        started = self._clock()
        ticket = Ticket(tenant, slots=max(1, min(slots, self._live.max_running)), adapter=adapter,
                        enqueued_at=started, background=True, preempt=preempt)
        while not self.may_start(ticket.slots):
            if self._live.live_slots() == 0:
                self._wake_when_quiet()  # waiting only for the quiet period, perhaps
            future: asyncio.Future = asyncio.get_running_loop().create_future()
            self._waiters.append(future)
            try:
                await future
            finally:
                if future in self._waiters:
                    self._waiters.remove(future)
        ticket.granted_at = self._clock()
        ticket.queue_seconds = ticket.granted_at - started
        self._tickets.append(ticket)
        self.held += ticket.slots
        if self._adapters is not None:
            self._adapters.start(adapter)
        return ticket

    def may_start(self, slots: int) -> bool:
        live = self._live
        if live.live_blocked() or live.max_running - live.live_slots() - self.held < slots:
            return False
        if live.live_slots() == 0 and self._clock() - live.last_live() >= self.quiet_s:
            return True
        return self.held + slots <= self.max_with_live

    def yield_to(self, slots: int) -> None:
        """A live request of `slots` arrived: preempt what it needs, newest background ticket first."""
        kept_tickets = [t for t in self._tickets if not t.preempted]
        kept = sum(t.slots for t in kept_tickets)
        giving_back = sum(t.slots for t in self._tickets if t.preempted)
        free = self._live.max_running - self._live.live_slots() - self.held + giving_back
        for ticket in reversed(kept_tickets):
            if kept <= self.max_with_live and free >= slots:
                break
            ticket.preempted = True
            kept -= ticket.slots
            free += ticket.slots
            if ticket.preempt is not None:
                ticket.preempt()

    def release(self, ticket: Ticket) -> None:
        if self._adapters is not None:
            self._adapters.stop(ticket.adapter)
        self._tickets.remove(ticket)
        self.held -= ticket.slots
        self._live.dispatch()
        self.wake()

    def wake(self) -> None:
        if self._waiters and self._live.live_slots() == 0:
            self._wake_when_quiet()
        if self._waiters and self.may_start(1):
            waiters, self._waiters = self._waiters, []
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    def _wake_when_quiet(self) -> None:
        """Background waiters get another look once the quiet period after the last live request has passed."""
        left = self.quiet_s - (self._clock() - self._live.last_live())
        if left <= 0 or self._quiet_wake is not None:
            return
        try:
            self._quiet_wake = asyncio.get_running_loop().call_later(left, self._on_quiet)
        except RuntimeError:  # no running loop: the next release wakes them
            return

    def _on_quiet(self) -> None:
        self._quiet_wake = None
        self.wake()
