"""Reliability runs against a real `loraplex serve` on loopback: a long soak at part load, and overload.

    python scripts/soak.py soak --minutes 90 --load 0.6      # RSS, open fds, TTFT p95 per 10-minute window; billing
    python scripts/soak.py overload --seconds 90 --load 2.0  # beyond capacity: only 429/503 + Retry-After
    python scripts/soak.py overload --admission max_running=16 --admission max_queue_wait_s=0.25
    python scripts/soak.py soak --minutes 30 --rate 6 --heap-profile-every-minutes 4   # where native memory goes
    python scripts/soak.py soak --minutes 25 --trace-every-minutes 5 --trace-only VLLM::EngineCor   # its Python memory
    python scripts/soak.py soak --minutes 25 --allocators-every-minutes 2.5   # pymalloc's and glibc's arenas

`--admission NAME=VALUE` sets the tenants file's `admission` section (a one-tenant file the script writes,
with a key it generates); without it the server runs open with its defaults.

Both first measure capacity (requests per second with `--concurrency` clients in a closed loop), then send an
open-loop Poisson stream at `--load` times it (or at `--rate` requests per second), mixing the base model and the
demo adapters (streamed, 32 output tokens). Every 10 s they sample the server's and its engine processes' RSS and
open file descriptors and the latency of the requests that finished in the window. At the end every request that
got an HTTP answer must have its row in the usage ledger; a request with none is counted by the client's error,
and by whether the server billed it anyway. Results: JSON and a plot under docs/results/ (reliability-*), a
summary on stdout. Load goes to 127.0.0.1 only; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes.util
import json
import os
import random
import sqlite3
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from bench_servers import REPO, demo_assets, free_port, loraplex_command, own_state, percentile_ms, running, say

RESULTS = REPO / "docs" / "results"
SAMPLE_S = 10.0
MAX_OUTSTANDING = 2000  # client-side bound on requests in flight, whatever the load
OUTPUT_TOKENS = 32


@dataclass
class Result:
    request_id: str
    sent_at: float
    status: int  # 0: no HTTP answer (connection error)
    ttft_s: float | None = None
    e2e_s: float | None = None
    retry_after: bool = False
    error: str | None = None  # the client's exception, by type, where there was no HTTP answer or it broke off


@dataclass
class Sample:
    t_s: float
    rss_mib: float
    open_fds: int
    finished: int
    p50_ms: float | None
    p99_ms: float | None
    ttft_p95_ms: float | None
    statuses: dict[str, int] = field(default_factory=dict)
    rss_mib_by_process: dict[str, float] = field(default_factory=dict)  # "name pid" -> MiB: which one grows


def process_tree(pid: int) -> list[int]:
    found, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found.append(child)
            frontier.append(child)
    return found


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def rss_mib_by_process(pids: list[int]) -> dict[str, float]:
    out = {}
    for pid in pids:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        out[f"{name} {pid}"] = round(rss_mib([pid]), 1)
    return out


def open_fds(pid: int) -> int:
    try:
        return len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except OSError:
        return -1


def tenants_file(state: str, admission: dict[str, float]) -> tuple[Path, str]:
    """A one-tenant file with the given admission settings, and the tenant's key."""
    import yaml

    from api.tenancy.keys import generate_key, hash_key

    key = generate_key()
    path = Path(state) / "tenants.yaml"
    path.write_text(yaml.safe_dump({"admission": admission, "tenants": [
        {"name": "load", "key_hashes": [hash_key(key)], "adapters": ["*"]}]}))
    return path, key


def trace_env(trace_every_minutes: float | None, heap_every_minutes: float | None,
              trace_only: list[str] = (), allocators_every_minutes: float | None = None) -> dict[str, str]:
    """The server's environment for `--trace-every-minutes`, `--heap-profile-every-minutes` and
    `--allocators-every-minutes`: sitecustomize on its path, a fresh output folder; for the heap profiler,
    gperftools' TCMalloc preloaded in every server process."""
    if trace_every_minutes is None and heap_every_minutes is None and allocators_every_minutes is None:
        return {}
    folder = RESULTS / ".soak-trace"
    if folder.exists():
        for old in folder.iterdir():
            old.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    path = [str(REPO / "scripts" / "soak_trace"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {"PYTHONPATH": os.pathsep.join(path)}
    if trace_every_minutes is not None:
        env |= {"LORAPLEX_SOAK_TRACE_DIR": str(folder), "LORAPLEX_SOAK_TRACE_EVERY_S": str(trace_every_minutes * 60)}
        if trace_only:
            env["LORAPLEX_SOAK_TRACE_ONLY"] = ",".join(trace_only)
    if allocators_every_minutes is not None:
        env |= {"LORAPLEX_SOAK_ALLOC_DIR": str(folder),
                "LORAPLEX_SOAK_ALLOC_EVERY_S": str(allocators_every_minutes * 60)}
    if heap_every_minutes is not None:
        if not ctypes.util.find_library("tcmalloc"):
            raise SystemExit("--heap-profile-every-minutes needs gperftools' TCMalloc: apt-get install "
                             "libgoogle-perftools4 google-perftools")
        env |= {"LD_PRELOAD": "libtcmalloc.so.4", "LORAPLEX_SOAK_HEAP_DIR": str(folder),
                "LORAPLEX_SOAK_HEAP_EVERY_S": str(heap_every_minutes * 60)}
    return env


def admission_setting(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, float(value) if "." in value else int(value)


async def one(client: httpx.AsyncClient, model: str, request_id: str) -> Result:
    result = Result(request_id, time.monotonic(), 0)
    body = {"model": model, "prompt": "the quick brown fox", "max_tokens": OUTPUT_TOKENS, "ignore_eos": True,
            "temperature": 0, "stream": True}
    try:
        async with client.stream("POST", "/v1/completions", json=body, headers={"X-Request-Id": request_id}) as r:
            result.status = r.status_code
            result.retry_after = "retry-after" in r.headers
            async for line in r.aiter_lines():
                if line.startswith("data: ") and result.ttft_s is None:
                    result.ttft_s = time.monotonic() - result.sent_at
    except httpx.HTTPError as e:
        result.error = type(e).__name__
    result.e2e_s = time.monotonic() - result.sent_at
    return result


async def capacity(client: httpx.AsyncClient, models: list[str], concurrency: int, seconds: float) -> float:
    """Requests per second that `concurrency` clients in a closed loop get through."""
    deadline = time.monotonic() + seconds
    done = 0

    async def worker(w: int) -> None:
        nonlocal done
        i = 0
        while time.monotonic() < deadline:
            result = await one(client, models[(w + i) % len(models)], f"cal-{w}-{i}-{time.time_ns()}")
            done += result.status == 200
            i += 1

    started = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return done / (time.monotonic() - started)


async def drive(base: str, headers: dict[str, str], server_pid: int, models: list[str], rate: float,
                seconds: float) -> tuple[list, list]:
    """Poisson arrivals at `rate` per second for `seconds`; samples every SAMPLE_S."""
    results: list[Result] = []
    samples: list[Sample] = []
    tasks: set[asyncio.Task] = set()
    limits = httpx.Limits(max_connections=MAX_OUTSTANDING, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits, headers=headers) as client:
        started = time.monotonic()
        next_sample = started + SAMPLE_S
        window: list[Result] = []
        i = 0
        rng = random.Random(0)
        while (now := time.monotonic()) - started < seconds:
            if now >= next_sample:
                samples.append(sample(now - started, server_pid, window))
                window = []
                next_sample += SAMPLE_S
            if len(tasks) < MAX_OUTSTANDING:
                task = asyncio.create_task(one(client, models[i % len(models)], f"soak-{i}-{time.time_ns()}"))
                task.add_done_callback(lambda t: (results.append(t.result()), window.append(t.result())))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
            await asyncio.sleep(rng.expovariate(rate))
        if tasks:
            await asyncio.wait(tasks, timeout=300)
        samples.append(sample(time.monotonic() - started, server_pid, window))
    return results, samples


def sample(t_s: float, server_pid: int, window: list[Result]) -> Sample:
    served = [r.e2e_s for r in window if r.status == 200 and r.e2e_s is not None]
    ttfts = [r.ttft_s for r in window if r.status == 200 and r.ttft_s is not None]
    statuses: dict[str, int] = {}
    for r in window:
        statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
    pids = process_tree(server_pid)
    return Sample(round(t_s, 1), round(rss_mib(pids), 1), open_fds(server_pid), len(window),
                  percentile_ms(served, 50), percentile_ms(served, 99), percentile_ms(ttfts, 95), statuses,
                  rss_mib_by_process(pids))


def windows(results: list[Result], samples: list[Sample], window_s: float) -> list[dict]:
    """The run in windows of `window_s` (by when requests were sent): RSS and open fds at the window's last sample
    and at its highest, requests, and the TTFT p95 of the requests it served."""
    if not results:
        return []
    origin = min(r.sent_at for r in results)
    out = []
    for k in range(int(max(s.t_s for s in samples) // window_s) + 1):
        lo, hi = k * window_s, (k + 1) * window_s
        sent = [r for r in results if lo <= r.sent_at - origin < hi]
        taken = [s for s in samples if lo < s.t_s <= hi] or [s for s in samples if s.t_s > lo][:1]
        if not sent or not taken:
            continue
        ttfts = [r.ttft_s for r in sent if r.status == 200 and r.ttft_s is not None]
        out.append({"minutes": [round(lo / 60, 1), round(hi / 60, 1)], "requests": len(sent),
                    "served": sum(1 for r in sent if r.status == 200),
                    "rss_mib_last": taken[-1].rss_mib, "rss_mib_max": max(s.rss_mib for s in taken),
                    "rss_mib_by_process_last": taken[-1].rss_mib_by_process,
                    "open_fds_last": taken[-1].open_fds, "open_fds_max": max(s.open_fds for s in taken),
                    "ttft_p95_ms": percentile_ms(ttfts, 95)})
    return out


def ledger_ids(path: Path) -> set[str]:
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return {row[0].split("#")[0] for row in db.execute("SELECT request_id FROM usage")}
    finally:
        db.close()


def plot(samples: list[Sample], title: str, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t_s / 60 for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    axes[0].plot(t, [s.rss_mib for s in samples], label="RSS, server + engine (MiB)")
    axes[0].legend(loc="lower right")
    axes[1].plot(t, [s.open_fds for s in samples], label="open fds (server)", color="tab:orange")
    axes[1].legend(loc="lower right")
    axes[2].plot(t, [s.p50_ms for s in samples], label="e2e p50 (ms)")
    axes[2].plot(t, [s.p99_ms for s in samples], label="e2e p99 (ms)")
    axes[2].plot(t, [s.ttft_p95_ms for s in samples], label="TTFT p95 (ms)")
    axes[2].legend(loc="upper right")
    axes[2].set_xlabel("minutes")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=90)


def summarize(mode: str, args: argparse.Namespace, cap: float, rate: float, results: list[Result],
              samples: list[Sample], billed: set[str]) -> dict:
    answered = [r for r in results if r.status]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
    refused = [r for r in answered if r.status in (429, 503)]
    steady = samples[1:-1] or samples
    served_ttft = [r.ttft_s for r in answered if r.status == 200 and r.ttft_s is not None]
    return {
        "mode": mode, "args": vars(args), "capacity_rps": round(cap, 2), "offered_rps": round(rate, 2),
        "requests": len(results), "statuses": statuses,
        # A request with no HTTP answer: what the client saw, and whether the server took it (its ledger row).
        "client_errors": dict(Counter(r.error for r in results if r.error)),
        "unanswered_with_ledger_row": sum(1 for r in results if not r.status and r.request_id in billed),
        "other_than_200_429_503": sum(1 for r in answered if r.status not in (200, 429, 503)),
        "refused_without_retry_after": sum(1 for r in refused if not r.retry_after),
        "answered_without_ledger_row": sum(1 for r in answered if r.request_id not in billed),
        "rss_mib": {"first": steady[0].rss_mib, "last": steady[-1].rss_mib,
                    "max": max(s.rss_mib for s in samples)},
        "open_fds": {"first": steady[0].open_fds, "last": steady[-1].open_fds,
                     "max": max(s.open_fds for s in samples)},
        "p99_ms_by_window": [s.p99_ms for s in samples],
        "ttft_p95_ms_served": percentile_ms(served_ttft, 95),
        "ttft_p50_ms_served": percentile_ms(served_ttft, 50),
        "e2e_p99_ms_first_last_quarter": [
            statistics.median([s.p99_ms for s in q if s.p99_ms is not None] or [0])
            for q in (steady[: max(1, len(steady) // 4)], steady[-max(1, len(steady) // 4):])],
        "windows": windows(results, samples, args.window_minutes * 60),
        "samples": [asdict(s) for s in samples],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("soak", "overload"))
    parser.add_argument("--minutes", type=float, default=20.0, help="soak duration (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=90.0, help="overload duration (default %(default)s)")
    parser.add_argument("--load", type=float, default=None, help="offered load as a multiple of the measured "
                        "capacity (default 0.6 for soak, 2.0 for overload)")
    parser.add_argument("--rate", type=float, default=None, help="offered requests per second, instead of --load: "
                        "the same load for runs that compare variants (capacity is still measured and reported)")
    parser.add_argument("--window-minutes", type=float, default=10.0, help="the summary's windows: RSS, open fds "
                        "and TTFT p95 per window (default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop clients when measuring capacity")
    parser.add_argument("--calibrate-s", type=float, default=30.0, help="seconds of capacity measurement")
    parser.add_argument("--admission", type=admission_setting, action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the tenants file's admission section (repeatable)")
    parser.add_argument("--trace-every-minutes", type=float, default=None, help="trace Python's allocations in "
                        "every server process from so many minutes after it starts, and write a tracemalloc "
                        "snapshot every so many minutes after that under docs/results/.soak-trace/ "
                        "(scripts/soak_trace/sitecustomize.py; tracing slows the server)")
    parser.add_argument("--trace-only", action="append", default=[], metavar="PROCESS",
                        help="with --trace-every-minutes: trace only this process, by its name as `ps -o comm` "
                        "shows it (VLLM::EngineCor, VLLM::Worker, python for the API server); repeatable")
    parser.add_argument("--heap-profile-every-minutes", type=float, default=None, help="run every server process "
                        "on gperftools' TCMalloc and start its heap profiler so many minutes after the process "
                        "starts; a profile and the bytes malloc holds every so many minutes after that, under "
                        "docs/results/.soak-trace/ (native allocations: what tracemalloc does not see)")
    parser.add_argument("--allocators-every-minutes", type=float, default=None, help="every so many minutes, "
                        "each server process appends its allocators' own view to docs/results/.soak-trace/"
                        "allocators.jsonl: pymalloc's arenas (mapped, live and free bytes) and glibc's per arena "
                        "(from the system, free): memory tracemalloc's live bytes do not show")
    args = parser.parse_args()
    load = args.load if args.load is not None else (0.6 if args.mode == "soak" else 2.0)
    seconds = args.minutes * 60 if args.mode == "soak" else args.seconds
    demo_assets()  # built once under the data home, which `serve --demo tiny` reads
    with tempfile.TemporaryDirectory(prefix="loraplex-soak-") as state:
        port = free_port()
        extra, headers = own_state(state), {}
        if args.admission:
            config, key = tenants_file(state, dict(args.admission))
            extra, headers = (*extra, "--config", str(config)), {"Authorization": f"Bearer {key}"}
        cmd = loraplex_command(port, {}, max_loras=4, max_cpu_loras=8, extra=("--demo", "tiny", *extra))
        log = RESULTS / f".{args.mode}-server-{port}.log"  # by port: two runs side by side keep their own
        env = trace_env(args.trace_every_minutes, args.heap_profile_every_minutes, args.trace_only,
                        args.allocators_every_minutes)
        with running(cmd, port, log, ready_path="/ready", env=env) as base:
            server_pid = int(next(p for p in Path("/proc").iterdir() if p.name.isdigit()
                                  and _is_server(p, port)).name)
            # The base model and every demo adapter, as the server names them.
            models = [m["id"] for m in httpx.get(f"{base}/v1/models", headers=headers, timeout=30).json()["data"]]
            say(f"measuring capacity ({args.calibrate_s:.0f} s, {args.concurrency} clients) over {models}")

            async def calibrate() -> float:
                async with httpx.AsyncClient(base_url=base, timeout=300, headers=headers) as client:
                    return await capacity(client, models, args.concurrency, args.calibrate_s)

            cap = asyncio.run(calibrate())
            if cap <= 0:
                raise SystemExit(f"no request succeeded while measuring capacity; see {log}")
            rate = args.rate if args.rate is not None else cap * load
            say(f"capacity {cap:.2f} req/s; offering {rate:.2f} req/s for {seconds:.0f} s")
            results, samples = asyncio.run(drive(base, headers, server_pid, models, rate, seconds))
            time.sleep(2)  # rows of the last responses commit before their last byte; let the writer finish
            billed = ledger_ids(Path(state) / "usage.sqlite")
    summary = summarize(args.mode, args, cap, rate, results, samples, billed)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"reliability-{args.mode}-{stamp}.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")
    plot(samples, f"{args.mode}: {rate:.1f} req/s, capacity {cap:.1f} req/s, {seconds / 60:.0f} min",
         out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("samples", "p99_ms_by_window", "windows")},
                     indent=2))
    for w in summary["windows"]:
        say(f"minutes {w['minutes'][0]:g}-{w['minutes'][1]:g}: RSS {w['rss_mib_last']:.0f} MiB (max "
            f"{w['rss_mib_max']:.0f}), fds {w['open_fds_last']} (max {w['open_fds_max']}), {w['served']}/"
            f"{w['requests']} served, TTFT p95 {w['ttft_p95_ms'] or 0:.0f} ms")
    say(f"wrote {out} and {out.with_suffix('.png')}")


def _is_server(proc: Path, port: int) -> bool:
    try:
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"api.cli" in cmdline and str(port).encode() in cmdline


if __name__ == "__main__":
    main()
