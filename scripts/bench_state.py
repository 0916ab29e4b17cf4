"""The `state` scenario: what sharing state between replicas costs a request. Admission (check-and-reserve plus
settle of a tenant's limits) in this process vs in Redis on loopback; one usage-ledger commit in SQLite vs
PostgreSQL on loopback. Real servers, started here on temporary directories like the tests' (PostgreSQL with
its durable defaults: fsync on, synchronous_commit on)."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from api.observability.outcome import RequestOutcome  # noqa: E402
from api.tenancy.config import TenantLimits  # noqa: E402
from api.tenancy.ledger import UsageLedger  # noqa: E402
from api.tenancy.limits_backend import MemoryLimits  # noqa: E402
from api.tenancy.limits_redis import RedisLimits  # noqa: E402
from tests.state_servers import PostgresServer, RedisServer  # noqa: E402

# Every limit set, none reached: each admission runs every check.
LIMITS = TenantLimits(requests_per_minute=10**9, tokens_per_minute=10**12, max_concurrent=10**6,
                      tokens_per_day=10**15, tokens_per_month=10**15)
RESERVE, USED = 96, 64


def _percentiles(samples_s: list[float]) -> dict:
    ms = sorted(s * 1000 for s in samples_s)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {"n": len(ms), "p50_ms": round(q[49], 4), "p99_ms": round(q[98], 4),
            "mean_ms": round(statistics.fmean(ms), 4)}


def _admission(backend, requests: int) -> dict:
    """Admit then settle, one request after another; every admission stays in the 60 s windows, so the last
    ones see `requests` entries there."""
    admit, settle = [], []
    for _ in range(requests):
        t0 = time.perf_counter()
        reservation = backend.admit("t", RESERVE)
        t1 = time.perf_counter()
        backend.settle(reservation, USED)
        t2 = time.perf_counter()
        admit.append(t1 - t0)
        settle.append(t2 - t1)
    return {"admit": _percentiles(admit), "settle": _percentiles(settle),
            "admit_settle": _percentiles([a + s for a, s in zip(admit, settle)])}


async def _admission_off_loop(backend, requests: int) -> dict:
    """As the server calls a remote backend: admission awaited in a worker thread, settlement not waited for."""
    admit = []
    for _ in range(requests):
        t0 = time.perf_counter()
        reservation = await asyncio.to_thread(backend.admit, "t", RESERVE)
        admit.append(time.perf_counter() - t0)
        backend.settle(reservation, USED)
    return {"admit": _percentiles(admit)}


def _ledger(url: str, requests: int, **kwargs) -> dict:
    commits = []
    with UsageLedger(url, **kwargs) as ledger:
        for i in range(requests):
            outcome = RequestOutcome(f"bench-{uuid.uuid4().hex}", "t", "standard", "m", "", 200, 64, 32, 0.01, 0.05,
                                     0.2, (), 0.0, 0.0, time.time())
            t0 = time.perf_counter()
            ledger.record(outcome, "stop")
            commits.append(time.perf_counter() - t0)
    return _percentiles(commits)


def run(out_dir: Path, quick: bool) -> dict:
    requests = 500 if quick else 3000
    commits = 200 if quick else 1000
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-state-") as tmp:
        root = Path(tmp)
        redis_server, postgres = RedisServer(root), PostgresServer(root, durable=True)
        try:
            admission = {"memory": _admission(MemoryLimits({"t": LIMITS}), requests)}
            shared = RedisLimits(redis_server.url, {"t": LIMITS}, prefix=f"bench-{uuid.uuid4().hex[:6]}")
            try:
                admission["redis"] = _admission(shared, requests)
                admission["redis, from the event loop"] = asyncio.run(_admission_off_loop(shared, requests))
            finally:
                shared.close()
            ledger = {
                "sqlite NORMAL": _ledger(str(root / "usage.sqlite"), commits),
                "sqlite FULL": _ledger(str(root / "usage-full.sqlite"), commits, synchronous="FULL"),
                "postgresql": _ledger(postgres.new_database(), commits),
            }
        finally:
            redis_server.stop()
            postgres.stop()
    return {"requests": requests, "commits": commits, "admission": admission, "ledger": ledger}


def tables(results: dict) -> list:
    def cells(r: dict, key: str) -> list:
        return [r[key]["p50_ms"], r[key]["p99_ms"]] if key in r else ["", ""]

    admission = [[backend, *cells(r, "admit"), *cells(r, "settle"), *cells(r, "admit_settle")]
                 for backend, r in results["admission"].items()]
    ledger = [[backend, r["p50_ms"], r["p99_ms"], r["mean_ms"]] for backend, r in results["ledger"].items()]
    return [
        (f"Admission per request, {results['requests']} requests one after another (ms)",
         ["limits", "admit p50", "admit p99", "settle p50", "settle p99", "both p50", "both p99"], admission),
        (f"One usage-ledger row committed, {results['commits']} rows (ms)",
         ["ledger", "p50", "p99", "mean"], ledger),
    ]
