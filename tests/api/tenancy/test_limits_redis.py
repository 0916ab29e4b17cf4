"""Redis limits across processes: leases that lapse when their holder dies, and exact limits under a race."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import redis

from api.tenancy.config import TenantLimits
from api.tenancy.limits_backend import LimitsUnavailable
from api.tenancy.limits_redis import RedisLimits
from api.tenancy.quotas import LimitExceeded
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[3]
PROCESSES = 4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_a_lease_not_renewed_lapses_and_gives_back_slots_and_tokens(redis_server, prefix):
    clock = Clock()
    limits = {"t": TenantLimits(max_concurrent=1, tokens_per_day=100)}
    holder = RedisLimits(redis_server.url, limits, lease_s=5.0, prefix=prefix, clock=clock)
    other = RedisLimits(redis_server.url, limits, lease_s=5.0, prefix=prefix, clock=clock)
    try:
        holder.admit("t", 100)
        clock.now += 4
        with pytest.raises(LimitExceeded):
            other.admit("t", 1)
        assert holder.renew() == 1  # the heartbeat: the lease now ends at 1009
        clock.now += 4.5
        with pytest.raises(LimitExceeded):
            other.admit("t", 1)
        clock.now += 1
        assert other.running("t") == 0
        other.admit("t", 100)  # the slot and the day's 100 tokens came back
        assert holder.renew() == 0  # nothing left to renew: the lapsed lease is gone
    finally:
        holder.close()
        other.close()


def test_settling_after_the_lease_lapsed_counts_what_was_used(redis_server, prefix):
    clock = Clock()
    backend = RedisLimits(redis_server.url, {"t": TenantLimits(tokens_per_day=150)}, lease_s=1.0, prefix=prefix,
                          clock=clock)
    try:
        slow = backend.admit("t", 100)
        clock.now += 2
        backend.settle(slow, 80)
        backend.admit("t", 70)
        with pytest.raises(LimitExceeded):
            backend.admit("t", 1)
    finally:
        backend.close()


def test_seeding_keeps_counts_other_replicas_made(redis_server, prefix):
    limits = {"t": TenantLimits(tokens_per_day=100)}
    first = RedisLimits(redis_server.url, limits, prefix=prefix)
    second = RedisLimits(redis_server.url, limits, prefix=prefix)
    try:
        first.seed_usage("t", 60, 60)
        first.admit("t", 30)
        second.seed_usage("t", 60, 60)  # a replica starting later, from the same ledger
        second.admit("t", 10)
        with pytest.raises(LimitExceeded):
            second.admit("t", 1)
    finally:
        first.close()
        second.close()


def test_an_unreachable_redis_is_an_error_not_an_admission():
    backend = RedisLimits(f"redis://127.0.0.1:{free_port()}/0", {"t": TenantLimits()})
    try:
        with pytest.raises(LimitsUnavailable, match="unreachable"):
            backend.admit("t", 1)
    finally:
        backend.close()


_WORKER = textwrap.dedent("""
    import json, sys
    import redis
    from api.tenancy.config import TenantLimits
    from api.tenancy.quotas import LimitExceeded
    from api.tenancy.limits_redis import RedisLimits

    url, prefix, attempts = sys.argv[1], sys.argv[2], int(sys.argv[3])
    limits = {"held": TenantLimits(max_concurrent=25), "rpm": TenantLimits(requests_per_minute=60),
              "daily": TenantLimits(tokens_per_day=1000)}
    backend = RedisLimits(url, limits, prefix=prefix)
    client = redis.Redis.from_url(url)
    client.rpush(prefix + ":ready", 1)
    client.blpop([prefix + ":go"], timeout=60)
    admitted = {"held": 0, "rpm": 0, "daily": 0}
    for _ in range(attempts):
        for tenant in admitted:
            try:
                reservation = backend.admit(tenant, 7)
            except LimitExceeded:
                continue
            admitted[tenant] += 1
            if tenant != "held":  # "held" keeps every slot it gets
                backend.settle(reservation, 7)
    print(json.dumps(admitted), flush=True)
""")


def _start_workers(url: str, prefix: str, argv: list[str], count: int) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", *argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(count)]
    client = redis.Redis.from_url(url)
    for _ in procs:
        assert client.blpop([f"{prefix}:ready"], timeout=60) is not None, "a worker did not start"
    return procs


def test_processes_racing_for_one_tenant_never_exceed_its_limits(redis_server, prefix):
    attempts = 60
    procs = _start_workers(redis_server.url, prefix, [_WORKER, redis_server.url, prefix, str(attempts)], PROCESSES)
    redis.Redis.from_url(redis_server.url).rpush(f"{prefix}:go", *range(PROCESSES))
    started = time.monotonic()
    outputs = [p.communicate(timeout=120) for p in procs]
    elapsed = time.monotonic() - started
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    counts = [json.loads(out) for out, _ in outputs]
    totals = {tenant: sum(c[tenant] for c in counts) for tenant in counts[0]}
    print(f"\n{PROCESSES} processes x {attempts} attempts x 3 tenants in {elapsed:.2f}s: admitted {totals}")
    # Every worker tried far more than each limit allows, so the limits were hit exactly.
    assert totals == {"held": 25, "rpm": 60, "daily": 1000 // 7}


_HOLDER = textwrap.dedent("""
    import sys, threading
    import redis
    from api.tenancy.config import TenantLimits
    from api.tenancy.limits_redis import RedisLimits

    url, prefix = sys.argv[1], sys.argv[2]
    backend = RedisLimits(url, {"t": TenantLimits(max_concurrent=2)}, lease_s=2.0, prefix=prefix)
    backend.admit("t", 1, sequences=2)
    redis.Redis.from_url(url).rpush(prefix + ":ready", 1)
    threading.Event().wait()  # holds its slots, renewing the lease, until killed
""")


def test_a_killed_replica_s_reservations_come_back_when_its_lease_lapses(redis_server, prefix):
    """Judged on a clock moved by hand to either side of the lease's expiry, not on how fast this test runs."""
    (holder,) = _start_workers(redis_server.url, prefix, [_HOLDER, redis_server.url, prefix], 1)
    at = {"now": 0.0}
    judge = RedisLimits(redis_server.url, {"t": TenantLimits(max_concurrent=2)}, prefix=prefix,
                        clock=lambda: at["now"])
    client = redis.Redis.from_url(redis_server.url)
    lease_key = f"{prefix}:{{t}}:lease"
    try:
        (first_expiry,) = [score for _, score in client.zrange(lease_key, 0, -1, withscores=True)]
        deadline = time.monotonic() + 10
        while client.zscore(lease_key, client.zrange(lease_key, 0, 0)[0]) <= first_expiry + 0.5:
            assert time.monotonic() < deadline, "the holder never renewed its lease"
            time.sleep(0.05)
        at["now"] = first_expiry + 0.1
        with pytest.raises(LimitExceeded):  # renewed past its first expiry: the live holder keeps its slots
            judge.admit("t", 1)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        killed_at = time.time()  # Redis's clock is this machine's wall clock
        (expiry,) = [score for _, score in client.zrange(lease_key, 0, -1, withscores=True)]
        # The dead holder's last renewal came before the kill: its slots lapse at most one lease (2 s) after it.
        assert expiry <= killed_at + 2.0
        at["now"] = expiry - 0.05
        with pytest.raises(LimitExceeded):
            judge.admit("t", 1)
        at["now"] = expiry + 0.05
        judge.admit("t", 1, sequences=2)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        judge.close()
