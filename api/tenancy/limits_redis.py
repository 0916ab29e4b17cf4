"""Tenant limits in Redis, shared by every replica: each check-and-reserve is one Lua script (EVALSHA), so two
replicas can never both take the last slot or token. The same limits, order of checks, Retry-After and
x-ratelimit-* values as the in-process limiter (api/tenancy/quotas.py).

Keys of one tenant share a hash tag (`{prefix}:{tenant}:...`), so a Redis Cluster keeps them on one shard:
  req        sorted set  reservation id -> admission time            (requests in the 60 s window)
  tok        sorted set  reservation id -> admission time            (token spends in the window)
  tokn       hash        reservation id -> tokens (reserved, then used); `#total`: their sum
  lease      sorted set  reservation id -> lease expiry              (slots held; renewed by the holder)
  leaseinfo  hash        reservation id -> "sequences reserved day month"
  budget     hash        d:YYYY-MM-DD / m:YYYY-MM -> tokens this UTC day / month, reservations included
Times are Redis's own clock (TIME), one clock for every replica, unless a test clock is given.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable

import redis

from api.tenancy.config import TenantLimits
from api.tenancy.limits_backend import LimitsUnavailable, Reservation
from api.tenancy.quotas import (
    CONCURRENCY_RETRY_S,
    WINDOW_S,
    WindowState,
    check_fits,
    day_key,
    month_key,
    rate_headers,
    refusal,
    reset_seconds,
)

logger = logging.getLogger(__name__)

DEFAULT_LEASE_S = 30.0
BUDGET_TTL_S = 40 * 86_400  # a month's budget outlives the month
KEY_NAMES = ("req", "tok", "tokn", "lease", "leaseinfo", "budget")

# ARGV[1] the time; negative: Redis's own clock, so replicas with skewed clocks agree.
_NOW = """
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

# Shared head of every script: KEYS as in KEY_NAMES; ARGV[1] the time (negative: Redis's clock), ARGV[2] the
# window. Drops what left the window and the leases that expired (giving back their slots and day/month tokens).
_PRELUDE = _NOW + """local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - window)) do
  redis.call('HINCRBY', KEYS[3], '#total', -tonumber(redis.call('HGET', KEYS[3], id) or '0'))
  redis.call('HDEL', KEYS[3], id)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
  local info = redis.call('HGET', KEYS[5], id)
  if info then
    local _, reserved, day, month = string.match(info, '(%d+) (%d+) (%S+) (%S+)')
    for _, f in ipairs({'d:' .. day, 'm:' .. month}) do
      if redis.call('HEXISTS', KEYS[6], f) == 1 then redis.call('HINCRBY', KEYS[6], f, -tonumber(reserved)) end
    end
    redis.call('HDEL', KEYS[5], id)
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)

local function window_tokens()
  return tonumber(redis.call('HGET', KEYS[3], '#total') or '0')
end

local function window_state()
  local last_spend, from = '', 0
  while last_spend == '' do  -- newest first, a page at a time: usually the newest one has tokens
    local page = redis.call('ZREVRANGE', KEYS[2], from, from + 15, 'WITHSCORES')
    if #page == 0 then break end
    for i = 1, #page, 2 do
      if tonumber(redis.call('HGET', KEYS[3], page[i]) or '0') > 0 then last_spend = page[i + 1]; break end
    end
    from = from + 16
  end
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  return {tostring(redis.call('ZCARD', KEYS[1])), last[2] or '', tostring(window_tokens()), last_spend,
          tostring(now)}
end
"""

# ARGV: now, window, id, reserve, sequences, rpm, tpm, max_concurrent, tokens/day, tokens/month (0: no limit),
# day key, month key, seconds to the next day, to the next month, lease seconds, budget ttl seconds.
# Returns {'ok', state...} or {limit name, retry-after seconds, state...}; numbers as strings (Lua's are floats).
_ADMIT = _PRELUDE + """
local id, reserve, seqs = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local rpm, tpm, maxc, tpd, tpmo = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]),
  tonumber(ARGV[10])
local dayf, monthf = 'd:' .. ARGV[11], 'm:' .. ARGV[12]
local lease_s, budget_ttl = tonumber(ARGV[15]), tonumber(ARGV[16])

local function refuse(limit, retry)
  local out = window_state()
  table.insert(out, 1, string.format('%.6f', retry))
  table.insert(out, 1, limit)
  return out
end

if maxc > 0 then
  local running = 0
  for _, info in ipairs(redis.call('HVALS', KEYS[5])) do running = running + tonumber(string.match(info, '^(%d+)')) end
  if running + seqs > maxc then return refuse('max_concurrent', tonumber(ARGV[17])) end
end
if rpm > 0 then
  local count = redis.call('ZCARD', KEYS[1])
  if count >= rpm then
    local at = redis.call('ZRANGE', KEYS[1], count - rpm, count - rpm, 'WITHSCORES')[2]
    return refuse('requests_per_minute', tonumber(at) + window - now)
  end
end
if tpm > 0 then
  local over = window_tokens() + reserve - tpm
  if over > 0 then  -- when will enough have left the window: oldest first
    local spends = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
    local freed, retry = 0, window
    for i = 1, #spends, 2 do
      freed = freed + tonumber(redis.call('HGET', KEYS[3], spends[i]) or '0')
      if freed >= over then retry = tonumber(spends[i + 1]) + window - now; break end
    end
    return refuse('tokens_per_minute', retry)
  end
end
for _, f in ipairs(redis.call('HKEYS', KEYS[6])) do
  if f ~= dayf and f ~= monthf then redis.call('HDEL', KEYS[6], f) end
end
if tpd > 0 and tonumber(redis.call('HGET', KEYS[6], dayf) or '0') + reserve > tpd then
  return refuse('tokens_per_day', tonumber(ARGV[13]))
end
if tpmo > 0 and tonumber(redis.call('HGET', KEYS[6], monthf) or '0') + reserve > tpmo then
  return refuse('tokens_per_month', tonumber(ARGV[14]))
end
redis.call('ZADD', KEYS[1], now, id)
redis.call('ZADD', KEYS[2], now, id)
redis.call('HSET', KEYS[3], id, reserve)
redis.call('HINCRBY', KEYS[3], '#total', reserve)
redis.call('ZADD', KEYS[4], now + lease_s, id)
redis.call('HSET', KEYS[5], id, seqs .. ' ' .. reserve .. ' ' .. ARGV[11] .. ' ' .. ARGV[12])
redis.call('HINCRBY', KEYS[6], dayf, reserve)
redis.call('HINCRBY', KEYS[6], monthf, reserve)
local keep = math.ceil(math.max(window * 2, lease_s * 4))
for i = 1, 5 do redis.call('EXPIRE', KEYS[i], keep) end
redis.call('EXPIRE', KEYS[6], budget_ttl)
local out = window_state()
table.insert(out, 1, 'ok')
return out
"""

# ARGV: now, window, id, actual tokens, current day key, current month key.
_SETTLE = _PRELUDE + """
local id, actual = ARGV[3], tonumber(ARGV[4])
local dayf, monthf = 'd:' .. ARGV[5], 'm:' .. ARGV[6]
local spent = redis.call('HGET', KEYS[3], id)
if spent then
  redis.call('HSET', KEYS[3], id, actual)
  redis.call('HINCRBY', KEYS[3], '#total', actual - tonumber(spent))
end
local info = redis.call('HGET', KEYS[5], id)
local reserved, day, month = 0, '', ''
if info then
  local _, r, d, m = string.match(info, '(%d+) (%d+) (%S+) (%S+)')
  reserved, day, month = tonumber(r), 'd:' .. d, 'm:' .. m
  redis.call('HDEL', KEYS[5], id)
  redis.call('ZREM', KEYS[4], id)
end
-- After a rollover (or a lease that lapsed, whose reservation went back) the use counts where it finished.
for _, pair in ipairs({{dayf, day}, {monthf, month}}) do
  if pair[1] == pair[2] then
    redis.call('HINCRBY', KEYS[6], pair[1], actual - reserved)
  else
    redis.call('HINCRBY', KEYS[6], pair[1], actual)
  end
end
return 1
"""

# ARGV: now, window, ids...  Reports the window; with ids, renews their leases (ARGV[3] lease seconds).
_STATE = _PRELUDE + """
local out = window_state()
local running = 0
for _, info in ipairs(redis.call('HVALS', KEYS[5])) do running = running + tonumber(string.match(info, '^(%d+)')) end
table.insert(out, tostring(running))
return out
"""

# ARGV: now, window (unused), lease seconds, ids... Moves the expiry of leases that still exist.
_RENEW = _NOW + """local lease_s = tonumber(ARGV[3])
local renewed = 0
for i = 4, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + lease_s, ARGV[i])
end
return renewed
"""

# ARGV: day field, month field, day tokens, month tokens, ttl.
_SEED = """
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSETNX', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
return 1
"""


def _window_state(values: list) -> tuple[WindowState, float]:
    requests, last_request, tokens, last_spend, now = (v.decode() if isinstance(v, bytes) else str(v)
                                                       for v in values[:5])
    return WindowState(int(requests), float(last_request) if last_request else None, int(tokens),
                       float(last_spend) if last_spend else None), float(now)


class RedisLimits:
    """Thread-safe. A daemon thread renews this process's leases every `lease_s / 3`; `clock` (tests) replaces
    Redis's clock with the caller's (seconds; the same on every process that shares the keys)."""

    remote = True

    def __init__(self, url: str, limits: dict[str, TenantLimits], lease_s: float = DEFAULT_LEASE_S,
                 prefix: str = "loraplex", clock: Callable[[], float] | None = None,
                 wall: Callable[[], float] = time.time):
        if lease_s <= 0:
            raise ValueError(f"lease_s must be positive, got {lease_s}")
        self.limits = limits
        self.lease_s = lease_s
        self._prefix = prefix
        self._clock = clock
        self._wall = wall
        self._client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._admit = self._client.register_script(_ADMIT)
        self._settle = self._client.register_script(_SETTLE)
        self._state = self._client.register_script(_STATE)
        self._renew = self._client.register_script(_RENEW)
        self._seed = self._client.register_script(_SEED)
        self._replica = uuid.uuid4().hex[:12]
        self._ids = itertools.count(1)
        self._held: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._renew_forever, name="limits-lease-renewal", daemon=True)
        self._heartbeat.start()

    def _keys(self, tenant: str) -> list[str]:
        return [f"{self._prefix}:{{{tenant}}}:{name}" for name in KEY_NAMES]

    def _now(self) -> float:
        return -1.0 if self._clock is None else self._clock()

    def _call(self, script, keys: list[str], args: list) -> list:
        try:
            return script(keys=keys, args=args)
        except redis.RedisError as e:
            raise LimitsUnavailable(f"the limits store is unreachable: {e}") from e

    def seed_usage(self, tenant: str, day_tokens: int, month_tokens: int) -> None:
        wall = self._wall()
        self._call(self._seed, [self._keys(tenant)[5]],
                   [f"d:{day_key(wall)}", f"m:{month_key(wall)}", day_tokens, month_tokens, int(BUDGET_TTL_S)])

    def admit(self, tenant: str, reserve_tokens: int, sequences: int = 1) -> Reservation:
        lim = self.limits[tenant]
        check_fits(lim, reserve_tokens, sequences)
        wall = self._wall()
        day, month = day_key(wall), month_key(wall)
        rid = f"{self._replica}:{next(self._ids)}"
        to_day, to_month = reset_seconds(wall)
        result = self._call(self._admit, self._keys(tenant), [
            self._now(), WINDOW_S, rid, reserve_tokens, sequences, lim.requests_per_minute or 0,
            lim.tokens_per_minute or 0, lim.max_concurrent or 0, lim.tokens_per_day or 0, lim.tokens_per_month or 0,
            day, month, to_day, to_month, self.lease_s, int(BUDGET_TTL_S), CONCURRENCY_RETRY_S])
        verdict = result[0].decode()
        if verdict != "ok":
            state, now = _window_state(result[2:])
            raise refusal(verdict, getattr(lim, verdict), float(result[1]), rate_headers(lim, state, now))
        with self._lock:
            self._held.setdefault(tenant, set()).add(rid)
        state, now = _window_state(result[1:])
        return Reservation(tenant, rid, reserve_tokens, sequences, day, month, rate_headers(lim, state, now))

    def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        if reservation.settled:
            return
        reservation.settled = True
        with self._lock:
            self._held.get(reservation.tenant, set()).discard(reservation.id)
        wall = self._wall()
        try:
            self._call(self._settle, self._keys(reservation.tenant),
                       [self._now(), WINDOW_S, reservation.id, actual_tokens, day_key(wall), month_key(wall)])
        except LimitsUnavailable:
            # Its lease lapses on its own, giving the slots back; the tokens are still in the ledger.
            logger.exception("could not settle reservation %s of tenant %r", reservation.id, reservation.tenant)

    def _read(self, tenant: str) -> list:
        return self._call(self._state, self._keys(tenant), [self._now(), WINDOW_S])

    def headers(self, tenant: str) -> dict[str, str]:
        state, now = _window_state(self._read(tenant))
        return rate_headers(self.limits[tenant], state, now)

    def running(self, tenant: str) -> int:
        return int(self._read(tenant)[5])

    def renew(self) -> int:
        """Extends the leases of every reservation this process holds; returns how many still existed."""
        with self._lock:
            held = {tenant: list(ids) for tenant, ids in self._held.items() if ids}
        renewed = 0
        for tenant, ids in held.items():
            renewed += self._call(self._renew, [self._keys(tenant)[3]], [self._now(), WINDOW_S, self.lease_s, *ids])
        return renewed

    def _renew_forever(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                self.renew()
            except LimitsUnavailable:
                logger.warning("could not renew limit leases", exc_info=True)

    def close(self) -> None:
        self._stop.set()
        self._heartbeat.join(timeout=5)
        self._client.close()
