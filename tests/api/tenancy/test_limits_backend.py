"""The same limits, 429s and headers from every LimitsBackend: in-process and a real redis-server."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest

from api.tenancy.config import TenantLimits
from api.tenancy.limits_backend import MemoryLimits
from api.tenancy.limits_redis import RedisLimits
from api.tenancy.quotas import LimitExceeded, NeverFits


def utc(*args) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


@dataclass
class Clock:
    now: float = 1000.0
    wall: float = utc(2025, 3, 14, 12, 0, 0)


@pytest.fixture(params=["memory", "redis"])
def make(request):
    """`make(clock, **limits)`: a backend for tenant `t` on `clock`, closed after the test."""
    opened = []

    def build(clock: Clock, lease_s: float = 30.0, **limits):
        config = {"t": TenantLimits(**limits)}
        if request.param == "memory":
            backend = MemoryLimits(config, clock=lambda: clock.now, wall=lambda: clock.wall)
        else:
            url = request.getfixturevalue("redis_server").url
            backend = RedisLimits(url, config, lease_s=lease_s, prefix=f"test-{uuid.uuid4().hex[:8]}",
                                  clock=lambda: clock.now, wall=lambda: clock.wall)
        opened.append(backend)
        return backend

    yield build
    for backend in opened:
        backend.close()


def refused(backend, reserve: int = 1, sequences: int = 1) -> LimitExceeded:
    with pytest.raises(LimitExceeded) as e:
        backend.admit("t", reserve, sequences)
    return e.value


def test_requests_per_minute_trips_on_the_fourth_and_recovers_after_the_window(make):
    clock = Clock()
    backend = make(clock, requests_per_minute=3)
    for t in (0.0, 10.0, 20.0):
        clock.now = 1000.0 + t
        reservation = backend.admit("t", 1)
    assert reservation.headers == backend.headers("t") == {
        "x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1m0s"}
    clock.now = 1030.0
    e = refused(backend)
    assert (e.limit, e.limit_value, e.retry_after_s) == ("requests_per_minute", 3, pytest.approx(30.0))
    assert e.headers == {"x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "0",
                         "x-ratelimit-reset-requests": "50s", "Retry-After": "30"}
    clock.now = 1060.0
    backend.admit("t", 1)
    clock.now = 1070.5
    assert backend.headers("t")["x-ratelimit-remaining-requests"] == "1"


def test_tokens_per_minute_reserves_then_settles_to_actual(make):
    clock = Clock()
    backend = make(clock, tokens_per_minute=1000)
    first = backend.admit("t", 400)
    clock.now += 1
    backend.admit("t", 400)
    clock.now += 1
    e = refused(backend, 400)
    assert (e.limit, e.retry_after_s) == ("tokens_per_minute", pytest.approx(58.0))
    assert e.headers["x-ratelimit-remaining-tokens"] == "200" and e.headers["Retry-After"] == "58"
    clock.now += 1
    backend.settle(first, 100)
    backend.settle(first, 999)  # a second settle does nothing
    assert backend.admit("t", 400).headers == {
        "x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "100", "x-ratelimit-reset-tokens": "1m0s"}
    clock.now += 58
    assert backend.headers("t")["x-ratelimit-remaining-tokens"] == "600"  # the first two have left


def test_max_concurrent_counts_sequences_and_frees_on_settle(make):
    clock = Clock()
    backend = make(clock, max_concurrent=4)
    three = backend.admit("t", 10, sequences=3)
    e = refused(backend, 10, sequences=2)
    assert (e.limit, e.headers) == ("max_concurrent", {"Retry-After": "1"})
    one = backend.admit("t", 10)
    assert backend.running("t") == 4
    backend.settle(three, 10)
    assert backend.running("t") == 1
    backend.admit("t", 10, sequences=3)
    backend.settle(one, 10)
    with pytest.raises(NeverFits):
        backend.admit("t", 10, sequences=5)
    assert backend.running("t") == 3


def test_daily_budget_seeded_from_the_ledger_resets_at_utc_midnight(make):
    clock = Clock(wall=utc(2025, 3, 14, 23, 59, 30))
    backend = make(clock, tokens_per_day=1000)
    backend.seed_usage("t", 900, 900)
    reservation = backend.admit("t", 100)
    e = refused(backend)
    assert (e.limit, e.retry_after_s, e.headers) == ("tokens_per_day", pytest.approx(30.0), {"Retry-After": "30"})
    backend.settle(reservation, 60)  # 960 used: 40 left today
    backend.admit("t", 40)
    refused(backend)
    clock.wall = utc(2025, 3, 15, 0, 0, 0)
    backend.admit("t", 1000)


def test_settle_after_midnight_counts_actual_use_in_the_new_day(make):
    clock = Clock(wall=utc(2025, 3, 14, 23, 59, 59))
    backend = make(clock, tokens_per_day=1000)
    a = backend.admit("t", 800)
    clock.wall = utc(2025, 3, 15, 0, 0, 5)
    backend.settle(a, 300)
    backend.admit("t", 700)
    assert refused(backend).limit == "tokens_per_day"


def test_monthly_budget_refuses_until_the_new_year(make):
    clock = Clock(wall=utc(2024, 12, 31, 23, 0, 0))
    backend = make(clock, tokens_per_month=500)
    backend.seed_usage("t", 0, 450)
    e = refused(backend, 100)
    assert (e.limit, e.retry_after_s) == ("tokens_per_month", pytest.approx(3600.0))
    clock.wall = utc(2025, 1, 1, 0, 0, 0)
    backend.admit("t", 500)


def test_refused_requests_take_nothing(make):
    clock = Clock()
    backend = make(clock, requests_per_minute=1, tokens_per_minute=100, max_concurrent=5)
    backend.admit("t", 10)
    for _ in range(5):
        clock.now += 1
        refused(backend, 10)
    assert backend.running("t") == 1
    assert backend.headers("t")["x-ratelimit-remaining-tokens"] == "90"
    with pytest.raises(NeverFits):
        backend.admit("t", 101)
    assert backend.running("t") == 1


def test_unlimited_tenant_headers_are_empty(make):
    backend = make(Clock())
    for _ in range(20):
        assert backend.admit("t", 10**9).headers == {}
    assert backend.running("t") == 20


def test_settling_after_the_window_passed_leaves_the_window_count_alone(make):
    clock = Clock()
    backend = make(clock, tokens_per_minute=1000)
    old = backend.admit("t", 400)
    clock.now += 30
    backend.admit("t", 300)
    clock.now += 31
    backend.settle(old, 900)  # its spend already left the window
    assert backend.headers("t")["x-ratelimit-remaining-tokens"] == "700"
    clock.now += 30
    assert backend.headers("t")["x-ratelimit-remaining-tokens"] == "1000"
