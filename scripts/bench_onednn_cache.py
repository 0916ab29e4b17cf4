"""oneDNN's primitive cache against RSS and speed: why engine processes run with ONEDNN_PRIMITIVE_CACHE_CAPACITY=64.

Each variant (a capacity, or oneDNN's default of 1024) runs in a process of its own (oneDNN reads the variable
once), in interleaved rounds. Two probes, on SmolLM2-sized weights (hidden 576, intermediate 1536):
- `onednn_mm`: vLLM's CPU linear (8 layers' handlers, their own per-layer cache of 32 as vLLM makes them) over a
  serving-like run of 2,700 steps: decode batches of 1-48 rows, and every 8th step a prefill chunk of 40-600 rows.
  RSS growth over the run, and milliseconds per step.
- `bmm`: torch's bfloat16 batched matmul (which the LoRA path uses and which has no cache of its own) over decode and
  prefill shapes: microseconds per call.

    python scripts/bench_onednn_cache.py [--rounds 2] [--out docs/results]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("default", "0", "64", "128")
K, N = 576, 1536
HANDLERS = 8


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def probe() -> dict:
    import torch
    import vllm._custom_ops as ops

    rng = random.Random(0)
    torch.manual_seed(0)
    handlers = [ops.create_onednn_mm(torch.randn(N, K).t(), 32) for _ in range(HANDLERS)]
    rows = {m: torch.randn(m, K) for m in range(1, 601)}
    steps = [rng.randint(40, 600) if i % 8 == 0 else rng.randint(1, 48) for i in range(3000)]
    for m in steps[:300]:
        for h in handlers:
            ops.onednn_mm(h, rows[m], None)
    before = _rss_mib()
    started = time.perf_counter()
    for m in steps[300:]:
        for h in handlers:
            ops.onednn_mm(h, rows[m], None)
    mm_ms = (time.perf_counter() - started) / (len(steps) - 300) * 1e3
    grown = _rss_mib() - before

    w = torch.randn(4, 64, K, dtype=torch.bfloat16)
    xs = {n: torch.randn(4, n, K, dtype=torch.bfloat16) for n in range(1, 200)}
    shapes = [rng.randint(100, 199) if i % 8 == 0 else rng.randint(1, 24) for i in range(3000)]
    for n in shapes[:200]:
        torch.bmm(xs[n], w.transpose(1, 2))
    started = time.perf_counter()
    for n in shapes[200:]:
        torch.bmm(xs[n], w.transpose(1, 2))
    bmm_us = (time.perf_counter() - started) / (len(shapes) - 200) * 1e6
    return {"rss_growth_mib": round(grown, 1), "onednn_mm_ms_per_step": round(mm_ms, 3), "bmm_us": round(bmm_us, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe()))
        return
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for round_ in range(args.rounds):
        for variant in VARIANTS:
            env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
            if variant != "default":
                env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = variant
            out = subprocess.run([sys.executable, __file__, "--probe"], env=env, capture_output=True, text=True,
                                 check=True).stdout
            runs[variant].append(json.loads(out.strip().splitlines()[-1]))
            print(f"round {round_ + 1} capacity {variant}: {runs[variant][-1]}", flush=True)
    summary = {v: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for v, rs in runs.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"onednn-cache-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps({"shapes": {"K": K, "N": N, "handlers": HANDLERS}, "runs": runs,
                                "median": summary}, indent=2))
    for variant, medians in summary.items():
        print(f"{variant:>8}: {medians}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
