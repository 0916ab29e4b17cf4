"""A hot adapter on 2 replicas: the share of its requests each replica serves, with and without a replica target.

`serve --demo tiny --replicas 2` (a local Ray instance), with `--adapter-replicas poet=2` (both replicas hold poet
from their start) and without (poet is loaded where its first request goes; affinity spills it to the other replica
only when its holder has `--affinity-max-ongoing` requests or more). Load: `--requests` streams of poet (64 tokens,
ignore_eos), `--concurrency` at a time. Per replica: the requests it took (the server's count, from /cluster), and
TTFT p50/p99 and output tok/s of the whole run. Setups alternate over rounds, each server started afresh:

    python scripts/bench_spread.py --rounds 2     # writes docs/results/spread-<time>.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from bench_servers import bounded, percentile_ms, setups_in_rounds, stream_ttft  # noqa: E402

HOT = "poet"
MAX_TOKENS = 64
PROMPT = "tell me a story about a river and a mountain"
COMMON = ("--demo", "tiny", "--replicas", "2", "--affinity-max-ongoing", "8")
SETUPS: dict[str, tuple[str, ...]] = {
    "target: 2 replicas": ("--adapter-replicas", f"{HOT}=2"),
    "no target": (),
}


async def _drive(base: str, requests: int, concurrency: int) -> dict:
    body = {"model": HOT, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}
    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
        await stream_ttft(client, body)  # its first request: where it goes first, it is loaded
        before = {r["replica_id"]: r["requests"] for r in (await client.get("/cluster")).json()["replicas"]}
        started = time.perf_counter()
        results = await bounded(concurrency, [lambda: stream_ttft(client, body) for _ in range(requests)])
        wall = time.perf_counter() - started
        after = (await client.get("/cluster")).json()["replicas"]
    taken = sorted((r["requests"] - before.get(r["replica_id"], 0) for r in after), reverse=True)
    ttfts = [t for t, _ in results]
    return {"requests_per_replica": taken, "holders": sum(1 for r in after if f"{HOT}@1" in r["residency"]["cpu"]),
            "ttft_p50_ms": round(percentile_ms(ttfts, 50), 1), "ttft_p99_ms": round(percentile_ms(ttfts, 99), 1),
            "output_tok_s": round(sum(n for _, n in results) / wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    args = parser.parse_args()
    setups = {name: (*COMMON, *extra) for name, extra in SETUPS.items()}
    runs = setups_in_rounds(setups, args.rounds, 2, args.out / ".spread.log",
                            lambda base: _drive(base, args.requests, args.concurrency))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"spread-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps({"adapter": HOT, "requests": args.requests, "concurrency": args.concurrency,
                                "max_tokens": MAX_TOKENS, "flags": list(COMMON),
                                "setups": {name: list(extra) for name, extra in SETUPS.items()}, "runs": runs},
                               indent=2))
    for name, rs in runs.items():
        print(f"{name:>20}: " + "; ".join(f"{r['requests_per_replica']} TTFT p99 {r['ttft_p99_ms']} ms" for r in rs))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
