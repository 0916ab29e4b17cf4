"""glibc's mmap threshold against engine throughput: MALLOC_MMAP_THRESHOLD_=131072 (fixed) or glibc's default.

The `kernels` scenario's engine (`scripts/bench_kernels.py`: loraplex's LoRA engine, compiled or eager with
`--eager`, offline, tiny model, 32 prompts x 64 greedy tokens; base only, 1 and 3 adapters of rank 16, 3 of rank
64) in a process of its own per run, with glibc's default (a threshold that rises as large blocks are freed) or a
fixed one (docs/reliability.md: what it does to RSS).
Rounds run in ABBA order so that a machine that warms up or slows down over the run favours neither; each workload
reports its best run per variant and the ratio per round.

    python scripts/bench_malloc.py [--rounds 2] [--eager] [--out docs/results]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bench_kernels import run_variant

MALLOC_MMAP_THRESHOLD = 128 * 2**10  # glibc's initial value, made fixed
VARIANTS = ("glibc-default", "fixed")
REPEATS = 3


def run_once(variant: str, engine: str, out_dir: Path) -> dict[str, float]:
    env_before = os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
    try:
        if variant == "fixed":
            os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MALLOC_MMAP_THRESHOLD)
        rows = run_variant(engine, out_dir, True, REPEATS, "tiny")
    finally:
        os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        if env_before is not None:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = env_before
    return {row["workload"]: max(row["runs"]) for row in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds (default %(default)s)")
    parser.add_argument("--eager", action="store_true",
                        help="the eager engine (native kernel, LORAPLEX_LORA_COMPILE=off)")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    args = parser.parse_args()
    engine = "native" if args.eager else "compiled"
    args.out.mkdir(parents=True, exist_ok=True)
    rounds = []
    for index in range(args.rounds):
        order = VARIANTS if index % 2 == 0 else VARIANTS[::-1]
        result = {}
        for variant in order:
            result[variant] = run_once(variant, engine, args.out)
            print(f"round {index + 1} {variant}: {result[variant]}", file=sys.stderr, flush=True)
        result["fixed / default"] = {w: result["fixed"][w] / result["glibc-default"][w] for w in result["fixed"]}
        rounds.append({"order": list(order), **result})
    workloads = list(rounds[0]["fixed"])
    best = {v: {w: max(r[v][w] for r in rounds) for w in workloads} for v in VARIANTS}
    path = args.out / f"malloc-threshold-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps({"engine": engine, "malloc_mmap_threshold": MALLOC_MMAP_THRESHOLD,
                                "repeats_per_run": REPEATS,
                                "statistic": "best run, tok/s", "rounds": rounds, "best": best}, indent=2) + "\n")
    for w in workloads:
        ratios = ", ".join(f"{r['fixed / default'][w]:.2f}" for r in rounds)
        print(f"{w:22s} default {best['glibc-default'][w]:6.0f}  fixed {best['fixed'][w]:6.0f} tok/s  "
              f"fixed/default per round: {ratios}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
