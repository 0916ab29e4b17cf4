"""Fair admission on the request path: wait for an engine slot in the tenant's queue, free it at close."""

from __future__ import annotations

from collections.abc import Callable

from adapters.manifest import Manifest
from api.auth import Caller
from api.errors import overloaded
from api.generation.accounting import RequestAccount
from api.generation.adapter_loading import AdapterLoader
from api.tenancy.config import TenancyConfig
from api.tenancy.fair_admission import FairAdmission, QueueFull
from engine.tracing import Tracing


class EngineAdmission:
    def __init__(self, tenancy: TenancyConfig, queue: FairAdmission, loader: AdapterLoader, tracing: Tracing):
        self.tenancy = tenancy
        self.queue = queue
        self.loader = loader
        self.tracing = tracing

    async def enter(self, caller: Caller, sequences: int, account: RequestAccount, adapter: Manifest | None) -> None:
        """Returns once the request holds a slot per sequence (503 with Retry-After when the queue is full).
        `adapter` (None: the base model) is the one it will most likely run: admission counts it against the
        engine's adapters per step, and prefetches it while the request waits."""
        with self.tracing.span("admission", tenant=caller.tenant):
            try:
                ticket = await self.queue.acquire(caller.tenant, self.tenancy.weight_of(caller.tenant), sequences,
                                                  adapter=None if adapter is None else adapter.label,
                                                  on_wait=lambda: self.loader.prefetch(adapter))
            except QueueFull as e:
                raise overloaded("The server's admission queue is full; retry later.", e.retry_after_s) from e
        account.queue_seconds = ticket.queue_seconds
        account.cleanups.append(lambda a: self.queue.release(ticket))

    async def enter_background(self, caller: Caller, sequences: int, account: RequestAccount,
                               preempt: Callable[[], None], adapter: Manifest | None) -> None:
        """A batch line's slots: waits, unbounded, for capacity live traffic leaves free. `preempt` is called
        when a live request needs the slots back; the line must then stop (closing its account frees them)."""
        with self.tracing.span("admission.background", tenant=caller.tenant):
            ticket = await self.queue.background.acquire(caller.tenant, sequences, preempt,
                                                         adapter=None if adapter is None else adapter.label)
        account.queue_seconds = ticket.queue_seconds
        account.cleanups.append(lambda a: self.queue.release(ticket))
