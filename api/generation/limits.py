"""Tenant limits on the request path: reserve requests and tokens at admission, settle them at close."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from api.auth import Caller
from api.errors import OpenAIError, bad_request, rate_limited
from api.generation.accounting import RequestAccount
from api.tenancy.limits_backend import LimitsBackend, LimitsUnavailable, Reservation
from api.tenancy.quotas import LimitExceeded, NeverFits

LIMITS_RETRY_AFTER_S = 2


class TenantLimits:
    """A backend whose calls cross the network (`remote`) runs them off the event loop: admission in a worker
    thread awaited by the request, settlement handed to a thread of its own so closing a request never waits."""

    def __init__(self, backend: LimitsBackend):
        self.backend = backend
        self._settler = ThreadPoolExecutor(1, thread_name_prefix="limits-settle") if backend.remote else None

    async def admit(self, caller: Caller, reserve_tokens: int, sequences: int, limit_param: str,
                    account: RequestAccount) -> dict[str, str]:
        """Reserves the request's sequences and `reserve_tokens` (prompt + output budget) or raises 429 / 400
        (503 when the shared limits store is unreachable); the reservation settles to the tokens really used when
        the account closes. `limit_param` names the request field that set the output budget, for a 400.
        Returns the x-ratelimit-* headers as of the reservation."""
        try:
            if self._settler is None:
                reservation = self.backend.admit(caller.tenant, reserve_tokens, sequences)
            else:
                reservation = await asyncio.to_thread(self.backend.admit, caller.tenant, reserve_tokens, sequences)
        except LimitExceeded as e:
            raise rate_limited(str(e), e.headers) from e
        except NeverFits as e:
            param = "n" if e.limit == "max_concurrent" else limit_param
            raise bad_request(str(e), param=param, code="exceeds_limit") from e
        except LimitsUnavailable as e:
            raise OpenAIError(503, "Rate limits cannot be checked right now, so the request is not served; retry "
                              "later.", code="limits_unavailable",
                              headers={"Retry-After": str(LIMITS_RETRY_AFTER_S)}) from e
        account.cleanups.append(lambda a: self._settle(reservation, a.prompt_tokens + a.completion_tokens))
        return reservation.headers

    def _settle(self, reservation: Reservation, tokens: int) -> None:
        if self._settler is None:
            self.backend.settle(reservation, tokens)
        else:
            self._settler.submit(self.backend.settle, reservation, tokens)

    def close(self) -> None:
        """Waits for the settlements handed off, then closes the backend."""
        if self._settler is not None:
            self._settler.shutdown(wait=True)
        self.backend.close()
