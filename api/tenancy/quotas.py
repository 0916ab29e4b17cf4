"""Per-tenant quotas: requests and tokens per minute, concurrency, daily and monthly token budgets.

Pure and single-threaded: every call takes the time. `now` is monotonic seconds (sliding windows,
concurrency), `wall` is unix time (UTC calendar buckets). Token limits reserve prompt + max_tokens at
admission; `settle` replaces the reservation with what the request really used.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone

from api.tenancy.config import TenantLimits

WINDOW_S = 60.0
# No way to know when a running request ends; a client retrying after this is rarely turned away twice.
CONCURRENCY_RETRY_S = 1.0


class LimitExceeded(Exception):
    """Over a quota now; retrying after `retry_after_s` may succeed (HTTP 429 with `headers`)."""

    def __init__(self, limit: str, limit_value: int, retry_after_s: float, headers: dict[str, str]):
        super().__init__(f"Rate limit reached for {limit}: limit {limit_value}. "
                         f"Please try again in {format_duration(retry_after_s)}.")
        self.limit = limit
        self.limit_value = limit_value
        self.retry_after_s = retry_after_s
        self.headers = headers


class NeverFits(Exception):
    """The request needs more than a limit ever allows; retrying cannot help (HTTP 400)."""

    def __init__(self, limit: str, limit_value: int, requested: int):
        if limit == "max_concurrent":
            message = (f"This request runs {requested} sequences (prompts x n), more than this tenant's "
                       f"max_concurrent limit of {limit_value}; lower n or send fewer prompts.")
        else:
            message = (f"This request needs up to {requested} tokens (prompt + max_tokens), more than this "
                       f"tenant's {limit} limit of {limit_value}; lower max_tokens or shorten the prompt.")
        super().__init__(message)
        self.limit = limit
        self.limit_value = limit_value
        self.requested = requested


def format_duration(seconds: float) -> str:
    """Go's duration format, as OpenAI's x-ratelimit-reset-* headers use: `20ms`, `1.5s`, `6m0s`, `1h2m3s`."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def day_key(wall: float) -> str:
    return datetime.fromtimestamp(wall, timezone.utc).strftime("%Y-%m-%d")


def month_key(wall: float) -> str:
    return datetime.fromtimestamp(wall, timezone.utc).strftime("%Y-%m")


def day_start(wall: float) -> float:
    t = datetime.fromtimestamp(wall, timezone.utc)
    return t.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()


def month_start(wall: float) -> float:
    t = datetime.fromtimestamp(wall, timezone.utc)
    return t.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def _seconds_to_next_day(wall: float) -> float:
    return day_start(wall) + 86_400 - wall


def _seconds_to_next_month(wall: float) -> float:
    t = datetime.fromtimestamp(month_start(wall), timezone.utc)
    nxt = t.replace(year=t.year + 1, month=1) if t.month == 12 else t.replace(month=t.month + 1)
    return nxt.timestamp() - wall


@dataclass
class _Spend:
    at: float
    tokens: int


@dataclass
class _Bucket:
    key: str = ""
    tokens: int = 0

    def roll(self, key: str) -> None:
        if key != self.key:
            self.key, self.tokens = key, 0


@dataclass
class Admission:
    """A reservation: `sequences` concurrency slots and `reserved` tokens, until `settle`."""

    id: int
    reserved: int
    sequences: int
    day: str
    month: str
    spend: _Spend
    settled: bool = field(default=False)


class TenantLimiter:
    def __init__(self, limits: TenantLimits):
        self.limits = limits
        self._requests: deque[float] = deque()
        self._tokens: deque[_Spend] = deque()
        self._tokens_total = 0  # sum of self._tokens: an admission does not walk the window
        self._running = 0
        self._day = _Bucket()
        self._month = _Bucket()
        self._ids = itertools.count(1)

    @property
    def running(self) -> int:
        return self._running

    def seed_usage(self, day_tokens: int, month_tokens: int, wall: float) -> None:
        """Tokens already spent this UTC day and month, e.g. from the usage ledger at start."""
        self._day = _Bucket(day_key(wall), day_tokens)
        self._month = _Bucket(month_key(wall), month_tokens)

    def usage(self, wall: float) -> tuple[int, int]:
        """Tokens counted against this UTC day and month, reservations included."""
        self._roll(wall)
        return self._day.tokens, self._month.tokens

    def admit(self, now: float, wall: float, reserve_tokens: int, sequences: int = 1) -> Admission:
        """Take a concurrency slot per sequence and reserve tokens, or raise LimitExceeded / NeverFits without
        taking anything."""
        lim = self.limits
        check_fits(lim, reserve_tokens, sequences)
        self._prune(now)
        self._roll(wall)
        if lim.max_concurrent is not None and self._running + sequences > lim.max_concurrent:
            self._refuse(now, "max_concurrent", lim.max_concurrent, CONCURRENCY_RETRY_S)
        if lim.requests_per_minute is not None and len(self._requests) >= lim.requests_per_minute:
            excess = len(self._requests) - lim.requests_per_minute
            self._refuse(now, "requests_per_minute", lim.requests_per_minute,
                         self._requests[excess] + WINDOW_S - now)
        if lim.tokens_per_minute is not None:
            over = self._tokens_total + reserve_tokens - lim.tokens_per_minute
            if over > 0:
                self._refuse(now, "tokens_per_minute", lim.tokens_per_minute, self._time_to_free(now, over))
        if lim.tokens_per_day is not None and self._day.tokens + reserve_tokens > lim.tokens_per_day:
            self._refuse(now, "tokens_per_day", lim.tokens_per_day, _seconds_to_next_day(wall))
        if lim.tokens_per_month is not None and self._month.tokens + reserve_tokens > lim.tokens_per_month:
            self._refuse(now, "tokens_per_month", lim.tokens_per_month, _seconds_to_next_month(wall))
        spend = _Spend(now, reserve_tokens)
        self._requests.append(now)
        self._tokens.append(spend)
        self._tokens_total += reserve_tokens
        self._running += sequences
        self._day.tokens += reserve_tokens
        self._month.tokens += reserve_tokens
        return Admission(next(self._ids), reserve_tokens, sequences, self._day.key, self._month.key, spend)

    def settle(self, admission: Admission, actual_tokens: int, now: float, wall: float) -> None:
        """Swap the reservation for the tokens really used and free the slot; later calls do nothing."""
        if admission.settled:
            return
        admission.settled = True
        self._running -= admission.sequences
        self._prune(now)
        self._roll(wall)
        if admission.spend.at > now - WINDOW_S:  # still in the window (pruning just dropped the older ones)
            self._tokens_total += actual_tokens - admission.spend.tokens
        admission.spend.tokens = actual_tokens  # counts only while its admission time is inside the window
        for bucket, key in ((self._day, admission.day), (self._month, admission.month)):
            # After a rollover the reservation went with the old bucket; the use counts where it finished,
            # as the ledger (keyed by finish time) will count it after a restart.
            bucket.tokens += actual_tokens - admission.reserved if bucket.key == key else actual_tokens

    def headers(self, now: float) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers for the per-minute limits that are set."""
        self._prune(now)
        newest = next((s for s in reversed(self._tokens) if s.tokens > 0), None)
        return rate_headers(self.limits, WindowState(len(self._requests),
                                                     self._requests[-1] if self._requests else None,
                                                     self._tokens_total, newest.at if newest else None), now)

    def _refuse(self, now: float, limit: str, value: int, retry_after_s: float) -> None:
        raise refusal(limit, value, retry_after_s, self.headers(now))


    def _prune(self, now: float) -> None:
        while self._requests and self._requests[0] <= now - WINDOW_S:
            self._requests.popleft()
        while self._tokens and self._tokens[0].at <= now - WINDOW_S:
            self._tokens_total -= self._tokens.popleft().tokens

    def _roll(self, wall: float) -> None:
        self._day.roll(day_key(wall))
        self._month.roll(month_key(wall))

    def _time_to_free(self, now: float, over: int) -> float:
        """Seconds until `over` tokens have left the window, counting reservations at face value."""
        freed = 0
        for spend in self._tokens:
            freed += spend.tokens
            if freed >= over:
                return spend.at + WINDOW_S - now
        return WINDOW_S


@dataclass(frozen=True)
class WindowState:
    """What the x-ratelimit-* headers report: the last 60 s of requests and tokens (times as `now`)."""

    requests: int
    last_request_at: float | None
    tokens: int
    last_spend_at: float | None  # the newest admission whose tokens still count


def check_fits(limits: TenantLimits, reserve_tokens: int, sequences: int) -> None:
    """Raises NeverFits when the request needs more than a limit ever allows."""
    for name, value, asked in (("tokens_per_minute", limits.tokens_per_minute, reserve_tokens),
                               ("tokens_per_day", limits.tokens_per_day, reserve_tokens),
                               ("tokens_per_month", limits.tokens_per_month, reserve_tokens),
                               ("max_concurrent", limits.max_concurrent, sequences)):
        if value is not None and asked > value:
            raise NeverFits(name, value, asked)


def rate_headers(limits: TenantLimits, state: WindowState, now: float) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers for the per-minute limits that are set."""
    out: dict[str, str] = {}
    rpm = limits.requests_per_minute
    if rpm is not None:
        out["x-ratelimit-limit-requests"] = str(rpm)
        out["x-ratelimit-remaining-requests"] = str(max(0, rpm - state.requests))
        reset = state.last_request_at + WINDOW_S - now if state.last_request_at is not None else 0.0
        out["x-ratelimit-reset-requests"] = format_duration(reset)
    tpm = limits.tokens_per_minute
    if tpm is not None:
        out["x-ratelimit-limit-tokens"] = str(tpm)
        out["x-ratelimit-remaining-tokens"] = str(max(0, tpm - state.tokens))
        reset = state.last_spend_at + WINDOW_S - now if state.last_spend_at is not None else 0.0
        out["x-ratelimit-reset-tokens"] = format_duration(reset)
    return out


def refusal(limit: str, value: int, retry_after_s: float, headers: dict[str, str]) -> LimitExceeded:
    """The 429 for `limit`: the rate headers plus Retry-After in whole seconds (at least 1)."""
    retry_after_s = max(0.0, retry_after_s)
    return LimitExceeded(limit, value, retry_after_s, {**headers, "Retry-After": str(max(1, math.ceil(retry_after_s)))})


def reset_seconds(wall: float) -> tuple[float, float]:
    """Seconds from `wall` to the next UTC day and month: when the calendar budgets refill."""
    return _seconds_to_next_day(wall), _seconds_to_next_month(wall)
