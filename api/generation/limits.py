"""Tenant limits on the request path: reserve requests and tokens at admission, settle them at close."""

from __future__ import annotations

from api.auth import Caller
from api.errors import OpenAIError, bad_request, rate_limited
from api.generation.accounting import RequestAccount
from api.tenancy.limits import LimitExceeded, NeverFits
from api.tenancy.limits_backend import LimitsBackend, LimitsUnavailable

LIMITS_RETRY_AFTER_S = 2


class TenantLimits:
    def __init__(self, backend: LimitsBackend):
        self.backend = backend

    def admit(self, caller: Caller, reserve_tokens: int, sequences: int, limit_param: str,
              account: RequestAccount) -> dict[str, str]:
        """Reserves the request's sequences and `reserve_tokens` (prompt + output budget) or raises 429 / 400
        (503 when the shared limits store is unreachable); the reservation settles to the tokens really used when
        the account closes. `limit_param` names the request field that set the output budget, for a 400.
        Returns the x-ratelimit-* headers as of the reservation."""
        try:
            reservation = self.backend.admit(caller.tenant, reserve_tokens, sequences)
        except LimitExceeded as e:
            raise rate_limited(str(e), e.headers) from e
        except NeverFits as e:
            param = "n" if e.limit == "max_concurrent" else limit_param
            raise bad_request(str(e), param=param, code="exceeds_limit") from e
        except LimitsUnavailable as e:
            raise OpenAIError(503, "Rate limits cannot be checked right now, so the request is not served; retry "
                              "later.", code="limits_unavailable",
                              headers={"Retry-After": str(LIMITS_RETRY_AFTER_S)}) from e
        account.cleanups.append(
            lambda a: self.backend.settle(reservation, a.prompt_tokens + a.completion_tokens))
        return reservation.headers
