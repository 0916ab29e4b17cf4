"""Tenant limits on the request path: reserve requests and tokens at admission, settle them at close."""

from __future__ import annotations

import time

from api.auth import Caller
from api.errors import bad_request, rate_limited
from api.generation.accounting import RequestAccount
from api.tenancy.limits import LimitExceeded, NeverFits, TenantLimiter


class TenantLimits:
    def __init__(self, limiters: dict[str, TenantLimiter]):
        self.limiters = limiters

    def admit(self, caller: Caller, reserve_tokens: int, sequences: int, limit_param: str,
              account: RequestAccount) -> None:
        """Reserves the request's sequences and `reserve_tokens` (prompt + output budget) or raises 429 / 400;
        the reservation settles to the tokens really used when the account closes. `limit_param` names the
        request field that set the output budget, for a 400."""
        limiter = self.limiters[caller.tenant]
        try:
            reservation = limiter.admit(time.monotonic(), time.time(), reserve_tokens, sequences)
        except LimitExceeded as e:
            raise rate_limited(str(e), e.headers) from e
        except NeverFits as e:
            param = "n" if e.limit == "max_concurrent" else limit_param
            raise bad_request(str(e), param=param, code="exceeds_limit") from e
        account.cleanups.append(
            lambda a: limiter.settle(reservation, a.prompt_tokens + a.completion_tokens, time.monotonic(),
                                     time.time()))

    def headers(self, caller: Caller) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers for the caller's tenant, as of now."""
        return self.limiters[caller.tenant].headers(time.monotonic())
