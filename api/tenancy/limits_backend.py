"""Where tenant limits are counted: in this process (`memory`, one replica) or in Redis (`redis://`, shared by
every replica), chosen by `--limits-url`. Both enforce the same limits with the same 429s and headers.

A reservation holds concurrency slots and reserved tokens from `admit` to `settle`. In Redis each holds a
lease that the replica renews while the request runs; a replica that dies stops renewing, and once its leases
expire their slots and reserved day/month tokens come back (its requests have no ledger row either).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from api.tenancy.config import TenantLimits
from api.tenancy.quotas import Admission, TenantLimiter


class LimitsUnavailable(Exception):
    """The shared limits store cannot be reached; the request is refused (HTTP 503), not served unmetered."""


@dataclass
class Reservation:
    """What `admit` took for one request; `headers` are the x-ratelimit-* headers just after it."""

    tenant: str
    id: str
    reserved: int
    sequences: int
    day: str
    month: str
    headers: dict[str, str] = field(default_factory=dict)
    settled: bool = False


class LimitsBackend(Protocol):
    remote: bool  # calls cross the network (the request path keeps them off its event loop)

    def seed_usage(self, tenant: str, day_tokens: int, month_tokens: int) -> None:
        """Tokens already spent this UTC day and month (from the ledger at start), unless already counted."""

    def admit(self, tenant: str, reserve_tokens: int, sequences: int = 1) -> Reservation:
        """Takes `sequences` slots and `reserve_tokens` atomically, or raises LimitExceeded / NeverFits (taking
        nothing) or LimitsUnavailable."""

    def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        """Swaps the reservation for the tokens really used and frees its slots; a second call does nothing."""

    def headers(self, tenant: str) -> dict[str, str]:
        """The x-ratelimit-* headers of `tenant` as of now."""

    def running(self, tenant: str) -> int:
        """Sequences of `tenant` holding slots, across every replica sharing the backend."""

    def close(self) -> None: ...


class MemoryLimits:
    """Per-process counters (api/tenancy/quotas.py); exact for one replica only."""

    remote = False

    def __init__(self, limits: dict[str, TenantLimits], clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self._limiters = {tenant: TenantLimiter(lim) for tenant, lim in limits.items()}
        self._clock = clock
        self._wall = wall
        self._admissions: dict[str, Admission] = {}

    def seed_usage(self, tenant: str, day_tokens: int, month_tokens: int) -> None:
        self._limiters[tenant].seed_usage(day_tokens, month_tokens, self._wall())

    def admit(self, tenant: str, reserve_tokens: int, sequences: int = 1) -> Reservation:
        limiter = self._limiters[tenant]
        now = self._clock()
        admission = limiter.admit(now, self._wall(), reserve_tokens, sequences)
        rid = f"{tenant}:{admission.id}"
        self._admissions[rid] = admission
        return Reservation(tenant, rid, reserve_tokens, sequences, admission.day, admission.month,
                           limiter.headers(now))

    def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        if reservation.settled:
            return
        reservation.settled = True
        admission = self._admissions.pop(reservation.id)
        self._limiters[reservation.tenant].settle(admission, actual_tokens, self._clock(), self._wall())

    def headers(self, tenant: str) -> dict[str, str]:
        return self._limiters[tenant].headers(self._clock())

    def running(self, tenant: str) -> int:
        return self._limiters[tenant].running

    def close(self) -> None:
        pass
