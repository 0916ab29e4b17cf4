"""Autoscaling on per-adapter queueing: one replica whose engine slot is taken, and an adapter whose requests wait.

`serve --demo tiny --replicas 1 --autoscale --max-replicas 2 --max-loras 1`: one engine slot. Two streams of
sql-helper run all the time (each re-sent as it ends), so poet's requests, one every `--interval` seconds, wait in
the engine for the slot. The replica's ongoing requests stay under `--target-ongoing-requests 48`, so Ray Serve's
own rule adds no replica; with `--target-adapter-waiting 4` the queue of poet asks for one, and routing then sends
poet's new requests to it. Setups (each server started afresh, alternating over rounds): the adapter-queue rule on,
and off (a target no queue reaches).
Per run: when the second replica was RUNNING (seconds from the first request), the requests each replica took, and
poet's TTFT p50/p99 over the run and over its last `--tail` seconds:

    python scripts/bench_autoscale.py --rounds 1     # writes docs/results/autoscale-<time>.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from bench_servers import percentile_ms, setups_in_rounds, stream_ttft  # noqa: E402

HOG, WAITER = "sql-helper", "poet"
HOG_STREAMS, HOG_TOKENS, WAITER_TOKENS = 2, 600, 16
PROMPT = "tell me a story about a river and a mountain"
COMMON = ("--demo", "tiny", "--replicas", "1", "--autoscale", "--min-replicas", "1", "--max-replicas", "2",
          "--target-ongoing-requests", "48", "--upscale-delay-s", "2", "--downscale-delay-s", "600")
SETUPS: dict[str, tuple[str, ...]] = {
    "adapter queues (target 4)": ("--target-adapter-waiting", "4"),
    "ongoing only": ("--target-adapter-waiting", "1000000"),
}


def _body(model: str, tokens: int) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": tokens, "ignore_eos": True, "temperature": 0}


async def _drive(base: str, seconds: float, interval: float, tail: float) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        await stream_ttft(client, _body(WAITER, 1))  # loaded once, so that its later waits are for the slot
        started = time.perf_counter()
        end = started + seconds
        two_running: float | None = None
        probes: list[tuple[float, float]] = []  # (sent at, TTFT) of each poet request

        async def hog() -> None:
            while time.perf_counter() < end:
                await stream_ttft(client, _body(HOG, HOG_TOKENS))

        async def probe() -> None:
            sent = time.perf_counter() - started
            ttft, _ = await stream_ttft(client, _body(WAITER, WAITER_TOKENS))
            probes.append((sent, ttft))

        async def watch() -> None:
            nonlocal two_running
            while time.perf_counter() < end and two_running is None:
                states = (await client.get("/cluster")).json().get("replica_states", {})
                if states.get("RUNNING", 0) >= 2:
                    two_running = time.perf_counter() - started
                await asyncio.sleep(1.0)

        tasks = [asyncio.create_task(hog()) for _ in range(HOG_STREAMS)] + [asyncio.create_task(watch())]
        while time.perf_counter() < end:
            tasks.append(asyncio.create_task(probe()))
            await asyncio.sleep(interval)
        await asyncio.gather(*tasks)
        replicas = (await client.get("/cluster")).json()["replicas"]
    ttfts = [t for _, t in probes]
    last = [t for sent, t in probes if sent >= seconds - tail]
    return {"second_replica_running_s": None if two_running is None else round(two_running, 1),
            "requests_per_replica": sorted((r["requests"] for r in replicas), reverse=True),
            "requests": len(probes), "ttft_p50_ms": round(percentile_ms(ttfts, 50), 1),
            "ttft_p99_ms": round(percentile_ms(ttfts, 99), 1), "tail_requests": len(last),
            "tail_ttft_p50_ms": round(percentile_ms(last, 50), 1),
            "tail_ttft_p99_ms": round(percentile_ms(last, 99), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between poet requests")
    parser.add_argument("--tail", type=float, default=45.0, help="the last seconds reported on their own")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    args = parser.parse_args()
    setups = {name: (*COMMON, *extra) for name, extra in SETUPS.items()}
    runs = setups_in_rounds(setups, args.rounds, 1, args.out / ".autoscale.log",
                            lambda base: _drive(base, args.seconds, args.interval, args.tail))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"autoscale-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps({"hog": HOG, "hog_streams": HOG_STREAMS, "hog_tokens": HOG_TOKENS, "waiter": WAITER,
                                "waiter_tokens": WAITER_TOKENS, "interval_s": args.interval,
                                "seconds": args.seconds, "tail_s": args.tail, "flags": [*COMMON, "--max-loras", "1"],
                                "setups": {name: list(extra) for name, extra in SETUPS.items()}, "runs": runs},
                               indent=2))
    for name, rs in runs.items():
        print(f"{name:>26}: " + "; ".join(
            f"2nd replica at {r['second_replica_running_s']} s, TTFT p99 {r['ttft_p99_ms']} ms "
            f"(last {args.tail:.0f} s: {r['tail_ttft_p99_ms']} ms)" for r in rs))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
