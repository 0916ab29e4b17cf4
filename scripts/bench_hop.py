"""The Ray hop alone: what streaming through one engine replica on Ray Serve adds to each request (TTFT) and to each
output token (TPOT), against the single-process server, side by side in one run.

The tiny demo model, base model only, one streamed request at a time (64 tokens, ignore_eos), the same engine
flags. Setups run one after another, in interleaved rounds, each server started afresh with its own state; the
medians over rounds are reported with every round's figures. The Ray setups (one replica, 20 ms window) differ in
`--hop-transport` and `--replica-niceness`:

    python scripts/bench_hop.py --rounds 3        # writes docs/results/hop-<time>.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from bench_cluster import HOP_MAX_TOKENS, MODEL_ID, hop_latency  # noqa: E402
from bench_servers import demo_assets, free_port, loraplex_command, own_state, running, say  # noqa: E402

RAY = ("--replicas", "1", "--hop-window-ms", "20")
SETUPS: dict[str, tuple[str, ...]] = {
    "single process": (),
    # What Ray gives a replica unless told: its worker (and so its engine) at niceness 15, requests as actor calls.
    "ray, actor calls, niceness 15": (*RAY, "--hop-transport", "actor", "--replica-niceness", "15"),
    "ray, actor calls": (*RAY, "--hop-transport", "actor"),
    "ray, gRPC (default)": RAY,
}
MEDIANS = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms")


async def _measure(base: str, num_requests: int) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
        await hop_latency(client, 3)  # warm-up
        measured = await hop_latency(client, num_requests)
    return {key: round(measured[key], 3) for key in MEDIANS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=40, help="measured requests per setup and round")
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    args = parser.parse_args()
    demo = demo_assets()
    runs: dict[str, list[dict]] = {name: [] for name in args.setups}
    for round_ in range(args.rounds):
        for name in args.setups:
            extra = SETUPS[name]
            port = free_port()
            with tempfile.TemporaryDirectory(prefix="loraplex-bench-hop-") as state:
                cmd = loraplex_command(port, {}, 1, 2, demo.model_dir, extra=(*own_state(state), *extra))
                with running(cmd, port, args.out / ".hop.log", ready_path="/ready") as base:
                    runs[name].append(asyncio.run(_measure(base, args.requests)))
            say(f"round {round_ + 1}, {name}: {runs[name][-1]}")
    medians = {name: {key: round(statistics.median(r[key] for r in rs), 3) for key in MEDIANS}
               for name, rs in runs.items()}
    single = medians.get("single process")
    if single is not None:
        for name, m in medians.items():
            m["ttft_added_ms"] = round(m["ttft_p50_ms"] - single["ttft_p50_ms"], 2)
            m["tpot_added_ms"] = round(m["tpot_p50_ms"] - single["tpot_p50_ms"], 3)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"hop-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps({"model": MODEL_ID, "max_tokens": HOP_MAX_TOKENS, "requests": args.requests,
                                "setups": {name: {"extra_flags": SETUPS[name]} for name in args.setups},
                                "runs": runs, "median": medians}, indent=2))
    for name, m in medians.items():
        print(f"{name:>24}: {m}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
