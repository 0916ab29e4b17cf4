"""Scenario `mixture`: what a mixture of adapters costs, on one loraplex server (tiny model), side by side.

1. Serving: a published composition of ranks 16 + 8 (support-bot and sql-helper, rank 24 by stacking) against a
   plain rank-24 adapter, both warm, the same streamed load interleaved over several rounds: output tok/s and TTFT.
2. First request: a mixture named per request that was never built (build + publish + load, then the first
   token) against a cold single rank-24 adapter (published, in no tier: fetch + validate + load, then the first
   token), alternating, a fresh one of each per round: the first token's latency.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from bench_servers import BenchModel, bounded, free_port, loraplex_command, percentile_ms, running_process, say

from adapters.base_model import base_model_spec
from adapters.demo.loras import ATTENTION, DemoAdapterSpec, build_adapter
from adapters.registry import Registry, RegistryConfig

MAX_TOKENS = 32
CONCURRENCY = 8
PLAIN = "plain-r24"
COMPOSED = "composed-16-8"


def _rank24(seed: int) -> DemoAdapterSpec:
    return DemoAdapterSpec(f"cold-{seed}", rank=24, alpha=24, target_modules=ATTENTION, seed=seed)


async def _stream(client: httpx.AsyncClient, model: str, index: int) -> float:
    body = {"model": model, "prompt": f"request {index}: tell a story", "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "temperature": 0, "stream": True}
    started, first = time.perf_counter(), None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{model}: {response.status_code} {(await response.aread()).decode()[:300]}")
        async for line in response.aiter_lines():
            if line.startswith("data: {") and first is None:
                first = time.perf_counter() - started
    return first if first is not None else time.perf_counter() - started


async def _load(base: str, model: str, num_prompts: int) -> tuple[list[float], float]:
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        started = time.perf_counter()
        ttfts = await bounded(CONCURRENCY, [lambda i=i: _stream(client, model, i) for i in range(num_prompts)])
        return ttfts, time.perf_counter() - started


async def _first(base: str, model: str) -> float:
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        return await _stream(client, model, 0)


def run(out_dir: Path, quick: bool, demo: BenchModel) -> dict:
    rounds = 2 if quick else 5
    num_prompts = 32 if quick else 64
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-mixture-") as tmp:
        state = Path(tmp)
        plain = build_adapter(demo.model_dir, DemoAdapterSpec(PLAIN, 24, 24, ATTENTION, seed=44), state / PLAIN)
        registry_config = RegistryConfig(store_uri=str(state / "blobs"), index_url=str(state / "index.sqlite"))
        registry = Registry.from_config(registry_config, base_model_spec(demo.model_dir), max_lora_rank=64)
        port = free_port()
        adapters = {**demo.adapter_dirs, PLAIN: plain}
        cmd = loraplex_command(port, adapters, 4, 8, demo.model_dir,
                               extra=("--store-uri", registry_config.store_uri, "--index-url",
                                      registry_config.index_url, "--disk-cache-dir", str(state / "disk")))
        serving: dict[str, list[dict]] = {PLAIN: [], COMPOSED: []}
        first: dict[str, list[float]] = {"cold_single_ms": [], "new_mixture_ms": []}
        try:
            with running_process(cmd, port, out_dir / ".mixture-loraplex.log") as (base, _proc):
                composed = httpx.post(f"{base}/v1/adapters/{COMPOSED}/compose", timeout=120, json={"components": [
                    {"model": "support-bot@1", "weight": 0.7}, {"model": "sql-helper@1", "weight": 0.3}]})
                composed.raise_for_status()
                for model in (PLAIN, COMPOSED):  # warm: loaded once before measuring
                    asyncio.run(_load(base, model, 8))
                for r in range(rounds):
                    for model in ((PLAIN, COMPOSED) if r % 2 == 0 else (COMPOSED, PLAIN)):
                        ttfts, wall = asyncio.run(_load(base, model, num_prompts))
                        row = {"tok_s": num_prompts * MAX_TOKENS / wall, "ttft_p50_ms": percentile_ms(ttfts, 50),
                               "ttft_p99_ms": percentile_ms(ttfts, 99)}
                        serving[model].append(row)
                        say(f"mixture: round {r + 1}/{rounds} {model:14s} {row['tok_s']:7.0f} tok/s "
                            f"TTFT p50 {row['ttft_p50_ms']:.1f} ms")
                for r in range(rounds):
                    spec = _rank24(100 + r)
                    registry.push(build_adapter(demo.model_dir, spec, state / spec.name), spec.name)
                    mixture = f"support-bot*{0.5 + r / 64!r}+sql-helper*0.5"  # a weight never asked for before
                    pair = [("cold_single_ms", spec.name), ("new_mixture_ms", mixture)]
                    for key, model in (pair if r % 2 == 0 else pair[::-1]):
                        first[key].append(asyncio.run(_first(base, model)) * 1000)
                        say(f"mixture: round {r + 1}/{rounds} first token of {key}: {first[key][-1]:.0f} ms")
        finally:
            registry.close()

    def mean(model: str, key: str) -> float:
        return statistics.fmean(row[key] for row in serving[model])

    summary = {
        **{f"{label}_{key}": mean(model, key) for label, model in (("plain", PLAIN), ("composed", COMPOSED))
           for key in ("tok_s", "ttft_p50_ms", "ttft_p99_ms")},
        "composed_over_plain_per_round": [c["tok_s"] / p["tok_s"] for c, p in
                                          zip(serving[COMPOSED], serving[PLAIN], strict=True)],
        **{f"{key}_median": statistics.median(values) for key, values in first.items()},
    }
    return {"model": demo.model_id, "rounds": rounds, "prompts": num_prompts, "max_tokens": MAX_TOKENS,
            "concurrency": CONCURRENCY, "serving": serving, "first_token": first, "summary": summary}


def tables(results: dict):
    s = results["summary"]
    serving = ("Serving, warm, concurrency 8", ["adapter", "rank", "tok/s", "TTFT p50 ms", "TTFT p99 ms"],
               [["plain", 24, round(s["plain_tok_s"]), f"{s['plain_ttft_p50_ms']:.1f}",
                 f"{s['plain_ttft_p99_ms']:.1f}"],
                ["composed 16 + 8", 24, round(s["composed_tok_s"]), f"{s['composed_ttft_p50_ms']:.1f}",
                 f"{s['composed_ttft_p99_ms']:.1f}"],
                ["composed / plain, per round", "",
                 ", ".join(f"{x:.2f}" for x in s["composed_over_plain_per_round"]), "", ""]])
    first = results["first_token"]
    cold = ("First request, one per round (alternating)", ["what", "first token ms, per round", "median ms"],
            [["cold single rank-24 adapter (fetch, validate, load)", ", ".join(f"{x:.0f}" for x in
                                                                            first["cold_single_ms"]),
              f"{s['cold_single_ms_median']:.0f}"],
             ["new mixture 16 + 8 per request (build, publish, load)", ", ".join(f"{x:.0f}" for x in
                                                                              first["new_mixture_ms"]),
              f"{s['new_mixture_ms_median']:.0f}"]])
    return [serving, cold]
