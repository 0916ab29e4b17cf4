"""Start-time fair queueing over per-tenant FIFOs (the order of `FairAdmission`'s waiting room).

Each waiting request gets the tag max(virtual time, its tenant's last finish); the tenant's last finish moves on
by cost / weight; the smallest tag among the tenants allowed to start goes first (ties by arrival) and the virtual
time moves up to its tag. A tenant that floods the queue only pushes its own tags out, so a newcomer is served
within one round, and over time tenants get slots in proportion to their weights.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(order=True)
class Entry(Generic[T]):
    tag: float
    seq: int
    tenant: str = field(compare=False)
    finish: float = field(compare=False)
    item: T = field(compare=False)
    live: bool = field(default=True, compare=False)


class FairQueue(Generic[T]):
    """Start-time fair queueing over per-tenant FIFOs. Pure; no clock, no asyncio."""

    def __init__(self) -> None:
        self._fifos: dict[str, deque[Entry[T]]] = {}
        self._seq = itertools.count()
        self._virtual_time = 0.0
        self._last_finish: dict[str, float] = {}
        self._queued: Counter[str] = Counter()
        self._total = 0

    def __len__(self) -> int:
        return self._total

    @property
    def virtual_time(self) -> float:
        return self._virtual_time

    def queued(self) -> dict[str, int]:
        return {tenant: n for tenant, n in self._queued.items() if n}

    def queued_of(self, tenant: str) -> int:
        return self._queued[tenant]

    def push(self, tenant: str, item: T, weight: float, cost: float = 1.0) -> Entry[T]:
        """Enqueue; the returned handle can be passed to `remove`."""
        if weight <= 0 or cost <= 0:
            raise ValueError(f"weight and cost must be positive, got weight={weight}, cost={cost}")
        tag = max(self._virtual_time, self._last_finish.get(tenant, 0.0))
        entry = Entry(tag, next(self._seq), tenant, tag + cost / weight, item)
        self._last_finish[tenant] = entry.finish
        self._queued[tenant] += 1
        self._total += 1
        self._fifos.setdefault(tenant, deque()).append(entry)
        return entry

    def pop(self) -> tuple[str, T]:
        """The waiting item with the smallest tag; IndexError when empty."""
        popped = self.pop_first(lambda tenant: True)
        if popped is None:
            raise IndexError("pop from an empty FairQueue")
        return popped

    def pop_first(self, eligible: Callable[[str], bool]) -> tuple[str, T] | None:
        """The waiting item with the smallest tag among tenants that `eligible` accepts; None if there is none."""
        first = self.first(eligible)
        return None if first is None else self._take(first)

    def first(self, eligible: Callable[[str], bool]) -> Entry[T] | None:
        """The item `pop_first(eligible)` would take, left in the queue. Within a tenant tags only grow, so only
        each tenant's head is a candidate."""
        best: Entry[T] | None = None
        for tenant in list(self._fifos):
            head = self._live_head(tenant)
            if head is None:
                del self._fifos[tenant]
            elif (best is None or head < best) and eligible(tenant):
                best = head
        return best

    def waiting(self) -> list[T]:
        """Every waiting item, tenant by tenant."""
        return [e.item for fifo in self._fifos.values() for e in fifo if e.live]

    def window(self, tenant: str, limit: int) -> list[Entry[T]]:
        """The first `limit` waiting items of `tenant`, in its order."""
        return list(itertools.islice((e for e in self._fifos.get(tenant, ()) if e.live), limit))

    def take(self, entry: Entry[T]) -> tuple[str, T]:
        """Starts `entry` (a live item of `window`) in its tenant's turn: it moves to the front and the items it
        passed move back one place each, every place keeping its tag and finish, so the tenant's account moves
        on exactly as if the head had gone, and the items passed over keep their order."""
        fifo = self._fifos[entry.tenant]
        if self._live_head(entry.tenant) is not entry:
            passed = [e for e in itertools.islice(fifo, fifo.index(entry) + 1) if e.live]
            places = [(e.tag, e.seq, e.finish) for e in passed]
            fifo.remove(entry)
            fifo.appendleft(entry)
            for moved, (tag, seq, finish) in zip([entry, *passed[:-1]], places):
                moved.tag, moved.seq, moved.finish = tag, seq, finish
        return self._take(entry)

    def _live_head(self, tenant: str) -> Entry[T] | None:
        fifo = self._fifos.get(tenant)
        while fifo and not fifo[0].live:
            fifo.popleft()
        return fifo[0] if fifo else None

    def _take(self, entry: Entry[T]) -> tuple[str, T]:
        self._fifos[entry.tenant].popleft()
        entry.live = False
        self._queued[entry.tenant] -= 1
        self._total -= 1
        self._virtual_time = max(self._virtual_time, entry.tag)
        return entry.tenant, entry.item

    def remove(self, entry: Entry[T]) -> bool:
        """Drop a waiting item; False if it already left. Its FIFO place is reclaimed lazily by `heads`."""
        if not entry.live:
            return False
        entry.live = False
        self._queued[entry.tenant] -= 1
        self._total -= 1
        if self._last_finish.get(entry.tenant) == entry.finish:
            # The tenant's newest item left: give back the share it had booked.
            self._last_finish[entry.tenant] = entry.tag
        return True
