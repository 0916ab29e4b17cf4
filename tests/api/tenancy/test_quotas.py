from __future__ import annotations

from datetime import datetime, timezone

import pytest

from api.tenancy.config import TenantLimits
from api.tenancy.quotas import (
    LimitExceeded,
    NeverFits,
    TenantLimiter,
    format_duration,
)


def utc(*args) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


WALL = utc(2025, 3, 14, 12, 0, 0)


def limiter(**limits) -> TenantLimiter:
    return TenantLimiter(TenantLimits(**limits))


def test_requests_per_minute_trips_on_the_fourth_and_recovers_after_the_window():
    lim = limiter(requests_per_minute=3)
    for t in (0.0, 10.0, 20.0):
        lim.admit(t, WALL, 1)
    assert lim.headers(20.0) == {
        "x-ratelimit-limit-requests": "3",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1m0s",
    }
    with pytest.raises(LimitExceeded) as e:
        lim.admit(30.0, WALL, 1)
    assert (e.value.limit, e.value.limit_value) == ("requests_per_minute", 3)
    assert e.value.retry_after_s == pytest.approx(30.0)  # the request at t=0 leaves the window at 60
    assert e.value.headers["Retry-After"] == "30"
    assert e.value.headers["x-ratelimit-remaining-requests"] == "0"
    assert e.value.headers["x-ratelimit-reset-requests"] == "50s"
    with pytest.raises(LimitExceeded):
        lim.admit(59.9, WALL, 1)
    lim.admit(60.0, WALL, 1)
    assert lim.headers(60.0)["x-ratelimit-remaining-requests"] == "0"
    assert lim.headers(70.5)["x-ratelimit-remaining-requests"] == "1"


def test_refused_requests_do_not_count():
    lim = limiter(requests_per_minute=1, tokens_per_minute=100)
    lim.admit(0.0, WALL, 10)
    for t in range(1, 30):
        with pytest.raises(LimitExceeded):
            lim.admit(float(t), WALL, 10)
    assert lim.running == 1
    assert lim.headers(30.0)["x-ratelimit-remaining-tokens"] == "90"
    lim.admit(60.0, WALL, 10)


def test_tokens_per_minute_reserves_then_settles_to_actual():
    lim = limiter(tokens_per_minute=1000)
    first = lim.admit(0.0, WALL, 400)
    lim.admit(1.0, WALL, 400)
    assert lim.headers(1.0)["x-ratelimit-remaining-tokens"] == "200"
    with pytest.raises(LimitExceeded) as e:
        lim.admit(2.0, WALL, 400)
    assert e.value.limit == "tokens_per_minute"
    assert e.value.retry_after_s == pytest.approx(58.0)  # the first reservation leaves at 60
    assert e.value.headers["x-ratelimit-remaining-tokens"] == "200"
    lim.settle(first, 100, now=3.0, wall=WALL)
    assert lim.headers(3.0)["x-ratelimit-remaining-tokens"] == "500"
    lim.admit(3.0, WALL, 400)
    assert lim.headers(3.0) == {
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "100",
        "x-ratelimit-reset-tokens": "1m0s",
    }
    assert lim.headers(61.0)["x-ratelimit-remaining-tokens"] == "600"  # t=0 and t=1 have left


def test_settle_may_raise_the_count_above_the_reservation():
    lim = limiter(tokens_per_minute=1000)
    a = lim.admit(0.0, WALL, 100)
    lim.settle(a, 700, now=1.0, wall=WALL)
    assert lim.headers(1.0)["x-ratelimit-remaining-tokens"] == "300"


def test_max_concurrent_frees_on_settle_and_settle_is_idempotent():
    lim = limiter(max_concurrent=2)
    a = lim.admit(0.0, WALL, 1)
    lim.admit(0.0, WALL, 1)
    with pytest.raises(LimitExceeded) as e:
        lim.admit(0.0, WALL, 1)
    assert (e.value.limit, e.value.headers) == ("max_concurrent", {"Retry-After": "1"})
    lim.settle(a, 1, now=1.0, wall=WALL)
    lim.settle(a, 1, now=1.0, wall=WALL)
    assert lim.running == 1
    lim.admit(1.0, WALL, 1)
    with pytest.raises(LimitExceeded):
        lim.admit(1.0, WALL, 1)


def test_headers_only_for_limits_that_are_set():
    assert limiter().headers(0.0) == {}
    assert limiter(max_concurrent=1, tokens_per_day=10).headers(0.0) == {}
    assert set(limiter(requests_per_minute=5).headers(0.0)) == {
        "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"}
    assert limiter(tokens_per_minute=5).headers(0.0)["x-ratelimit-reset-tokens"] == "0s"


def test_unlimited_admits_anything():
    lim = limiter()
    for t in range(1000):
        lim.admit(float(t) / 1000, WALL, 10**9)
    assert lim.running == 1000


def test_daily_budget_seeded_from_the_ledger_resets_at_utc_midnight():
    lim = limiter(tokens_per_day=1000)
    late = utc(2025, 3, 14, 23, 59, 30)
    lim.seed_usage(900, 900, wall=late)
    lim.admit(0.0, late, 100)
    with pytest.raises(LimitExceeded) as e:
        lim.admit(1.0, late, 1)
    assert e.value.limit == "tokens_per_day"
    assert e.value.retry_after_s == pytest.approx(30.0)
    assert e.value.headers == {"Retry-After": "30"}
    lim.admit(2.0, utc(2025, 3, 15, 0, 0, 0), 1000)
    assert lim.usage(utc(2025, 3, 15, 0, 0, 1)) == (1000, 2000)


def test_monthly_budget_resets_at_the_new_year():
    lim = limiter(tokens_per_month=500)
    lim.seed_usage(0, 450, wall=utc(2024, 12, 20))
    with pytest.raises(LimitExceeded) as e:
        lim.admit(0.0, utc(2024, 12, 31, 23, 0, 0), 100)
    assert e.value.limit == "tokens_per_month"
    assert e.value.retry_after_s == pytest.approx(3600.0)
    lim.admit(1.0, utc(2025, 1, 1, 0, 0, 0), 500)


def test_seed_from_an_earlier_day_does_not_count_today():
    lim = limiter(tokens_per_day=100, tokens_per_month=1000)
    lim.seed_usage(100, 900, wall=utc(2025, 3, 13, 10))
    lim.admit(0.0, utc(2025, 3, 14, 10), 100)
    assert lim.usage(utc(2025, 3, 14, 10)) == (100, 1000)


def test_settle_after_midnight_counts_actual_use_in_the_new_day():
    lim = limiter(tokens_per_day=1000)
    before = utc(2025, 3, 14, 23, 59, 59)
    after = utc(2025, 3, 15, 0, 0, 5)
    a = lim.admit(0.0, before, 800)
    lim.settle(a, 300, now=6.0, wall=after)
    assert lim.usage(after) == (300, 300)
    b = lim.admit(7.0, after, 700)
    lim.settle(b, 200, now=8.0, wall=after)
    assert lim.usage(after) == (500, 500)


@pytest.mark.parametrize(("limits", "reserve", "limit"), [
    ({"tokens_per_minute": 1000}, 1001, "tokens_per_minute"),
    ({"tokens_per_day": 500, "tokens_per_minute": 1000}, 501, "tokens_per_day"),
    ({"tokens_per_month": 50}, 51, "tokens_per_month"),
])
def test_a_request_that_can_never_fit_is_not_a_rate_limit(limits, reserve, limit):
    lim = limiter(**limits)
    with pytest.raises(NeverFits) as e:
        lim.admit(0.0, WALL, reserve)
    assert (e.value.limit, e.value.requested) == (limit, reserve)
    assert lim.running == 0
    lim.admit(0.0, WALL, reserve - 1)


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"),
    (-3, "0s"),
    (0.0004, "1ms"),
    (0.02, "20ms"),
    (0.999, "999ms"),
    (1, "1s"),
    (1.5, "1.5s"),
    (59.2, "59.2s"),
    (60, "1m0s"),
    (90.25, "1m30.25s"),
    (360, "6m0s"),
    (3723, "1h2m3s"),
    (86400, "24h0m0s"),
])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_max_concurrent_counts_sequences():
    lim = limiter(max_concurrent=4)
    three = lim.admit(0.0, WALL, 10, sequences=3)
    with pytest.raises(LimitExceeded) as e:
        lim.admit(0.0, WALL, 10, sequences=2)
    assert e.value.limit == "max_concurrent"
    one = lim.admit(0.0, WALL, 10, sequences=1)
    assert lim.running == 4
    lim.settle(three, 10, 1.0, WALL)
    lim.settle(one, 10, 1.0, WALL)
    assert lim.running == 0


def test_more_sequences_than_max_concurrent_never_fit():
    lim = limiter(max_concurrent=4)
    with pytest.raises(NeverFits) as e:
        lim.admit(0.0, WALL, 10, sequences=5)
    assert (e.value.limit, e.value.requested) == ("max_concurrent", 5) and "sequences" in str(e.value)
    assert lim.running == 0


def test_settling_after_the_window_passed_leaves_the_window_count_alone():
    lim = limiter(tokens_per_minute=1000)
    old = lim.admit(0.0, WALL, 400)
    lim.admit(30.0, WALL, 300)
    lim.settle(old, 900, now=61.0, wall=WALL)  # its spend already left the window
    assert lim.headers(61.0)["x-ratelimit-remaining-tokens"] == "700"
    assert lim.headers(91.0)["x-ratelimit-remaining-tokens"] == "1000"
