"""Everything between a parsed request and the engine, in order: tenant limits, fair admission, adapter tiers.

Each step that takes something (a limit reservation, an engine slot, an adapter reference) registers its
give-back on the request's account, so the account's single close returns all of it whatever happened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from adapters.tiers import AdapterTiers
from api.accounting import RequestAccount
from api.catalog import ServedModel, Visibility
from api.errors import OpenAIError, bad_request, overloaded, rate_limited
from api.observability.tracing import Tracing
from api.tenancy.admission import FairAdmission, QueueFull
from api.tenancy.config import TenancyConfig
from api.tenancy.limits import LimitExceeded, NeverFits, TenantLimiter, check_max_tokens
from adapters.local import AdapterValidationError, LocalAdapter
from engine.types import EngineError


@dataclass(frozen=True)
class Caller:
    """Who is asking, from the API key."""

    tenant: str
    is_admin: bool = False


class Gate:
    def __init__(self, tenancy: TenancyConfig, limiters: dict[str, TenantLimiter], admission: FairAdmission,
                 tiers: AdapterTiers | None, tracing: Tracing):
        self.tenancy = tenancy
        self.limiters = limiters
        self.admission = admission
        self.tiers = tiers
        self.tracing = tracing

    def may_use(self, caller: Caller) -> Visibility:
        return lambda adapter_name: self.tenancy.may_use(caller.tenant, adapter_name)

    def max_tokens(self, caller: Caller, requested: int | None) -> int | None:
        cap = self.tenancy.tenant(caller.tenant).limits.max_tokens
        try:
            return check_max_tokens(requested, cap)
        except ValueError as e:
            raise bad_request(str(e), param="max_tokens") from e

    def limit_headers(self, caller: Caller) -> dict[str, str]:
        return self.limiters[caller.tenant].headers(time.monotonic())

    async def enter(self, caller: Caller, served: ServedModel, account: RequestAccount,
                    reserve_tokens: int) -> LocalAdapter | None:
        """Admits the request to the engine; returns the adapter to run with (None for the base model)."""
        limiter = self.limiters[caller.tenant]
        try:
            reservation = limiter.admit(time.monotonic(), time.time(), reserve_tokens)
        except LimitExceeded as e:
            raise rate_limited(str(e), e.headers) from e
        except NeverFits as e:
            raise bad_request(str(e), param="max_tokens", code="exceeds_limit") from e
        account.cleanups.append(
            lambda a: limiter.settle(reservation, a.prompt_tokens + a.completion_tokens, time.monotonic(),
                                     time.time()))
        tenant = self.tenancy.tenant(caller.tenant)
        weight = self.tenancy.priority_classes[tenant.priority].weight
        with self.tracing.span("admission", tenant=caller.tenant):
            try:
                ticket = await self.admission.acquire(caller.tenant, weight)
            except QueueFull as e:
                raise overloaded("The server's admission queue is full; retry later.", e.retry_after_s) from e
        account.queue_seconds = ticket.queue_seconds
        account.cleanups.append(lambda a: self.admission.release(ticket))
        if served.manifest is None or self.tiers is None:
            return None
        with self.tracing.span("adapter.load", adapter=served.id):
            try:
                acquired = await self.tiers.acquire(served.manifest)
            except AdapterValidationError as e:
                raise OpenAIError(500, f"Adapter {served.id} failed validation: {'; '.join(e.problems)}",
                                  code="adapter_invalid") from e
            except (EngineError, OSError, ValueError) as e:
                raise OpenAIError(503, f"Adapter {served.id} could not be loaded: {e}",
                                  code="adapter_load_failed") from e
        account.cleanups.append(lambda a: self.tiers.release(acquired))
        return acquired.adapter
