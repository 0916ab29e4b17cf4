"""Scenario `cluster`: engine replicas on Ray Serve (`serve --replicas 2`) against the single-process server.

1. Zipf(1.1) traffic over 64 adapters, concurrency 8: cold adapter loads (into an engine's CPU tier) and TTFT
   p50/p99, on one engine, and on 2 replicas routed with adapter affinity and with Ray Serve's default router
   (power of two choices). Every engine has max_loras 4 and max_cpu_loras 8.
2. The Ray hop: the base model, one request at a time, on one engine and through 2 replicas: TTFT (per request)
   and time per output token.
3. Scale to zero: a server autoscaling between 0 and 1 replicas, started with none: the first request's TTFT (it
   waits for a replica and its engine to start), then a warm one.

Servers run one after another on the same machine, each with its own empty registry and caches; the 2 replicas
share the machine's cores with each other (on this 2-core host they do not add compute).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import httpx
from bench_servers import (
    bounded,
    demo_assets,
    free_port,
    loraplex_command,
    many_adapters,
    own_state,
    percentile_ms,
    running,
    say,
    stream_ttft,
)
from bench_tiers import tier_counts, zipf_schedule

from adapters.demo.tiny_llama import TinyLlamaSpec

MODEL_ID = TinyLlamaSpec().model_id
NUM_ADAPTERS, ZIPF_S, CONCURRENCY, MAX_TOKENS, RANK = 64, 1.1, 8, 32, 8
MAX_LORAS, MAX_CPU_LORAS, REPLICAS = 4, 8, 2
HOP_REQUESTS, HOP_MAX_TOKENS = 30, 64
PROMPT = "tell me a story about a river and a mountain"
SETUPS = (("single process", ()),
          ("2 replicas, affinity", ("--replicas", str(REPLICAS), "--routing", "affinity")),
          ("2 replicas, power of two", ("--replicas", str(REPLICAS), "--routing", "power_of_two")))


def _body(model: str, max_tokens: int = MAX_TOKENS) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}


async def _cold_loads(client: httpx.AsyncClient, clustered: bool) -> float:
    """Adapter loads into an engine's CPU tier so far: from /metrics on one engine, summed over /cluster's replicas."""
    if clustered:
        return sum(r["loads"] for r in (await client.get("/cluster")).json()["replicas"])
    return tier_counts((await client.get("/metrics")).text).get("cpu", {}).get("loads", 0.0)


async def _zipf(client: httpx.AsyncClient, names: list[str], num_requests: int, clustered: bool) -> dict:
    models = [names[i] for i in zipf_schedule(len(names), num_requests, ZIPF_S)]
    before = await _cold_loads(client, clustered)
    started = time.perf_counter()
    results = await bounded(CONCURRENCY, [lambda m=m: stream_ttft(client, _body(m)) for m in models])
    wall = time.perf_counter() - started
    ttfts = [t for t, _ in results]
    return {"requests": num_requests, "distinct_used": len(set(models)),
            "cold_loads": await _cold_loads(client, clustered) - before,
            "ttft_p50_ms": percentile_ms(ttfts, 50), "ttft_p99_ms": percentile_ms(ttfts, 99),
            "output_tok_s": sum(n for _, n in results) / wall, "wall_s": wall}


async def hop_latency(client: httpx.AsyncClient, num_requests: int) -> dict:
    """The base model, `num_requests` streams one at a time: TTFT and time per output token (the Ray hop's cost)."""
    ttfts, per_token = [], []
    for _ in range(num_requests):
        started = time.perf_counter()
        ttft, tokens = await stream_ttft(client, _body(MODEL_ID, HOP_MAX_TOKENS))
        total = time.perf_counter() - started
        ttfts.append(ttft)
        per_token.append((total - ttft) / max(1, tokens - 1))
    return {"requests": num_requests, "max_tokens": HOP_MAX_TOKENS, "ttft_p50_ms": percentile_ms(ttfts, 50),
            "ttft_p90_ms": percentile_ms(ttfts, 90), "ttft_p99_ms": percentile_ms(ttfts, 99),
            "tpot_p50_ms": percentile_ms(per_token, 50)}


COLD_FLAGS = ("--replicas", "0", "--autoscale", "--min-replicas", "0", "--max-replicas", "1", "--upscale-delay-s", "0",
              "--downscale-delay-s", "600")


def _cold_start(demo, out_dir: Path) -> dict:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-cluster-") as state:
        cmd = loraplex_command(port, {}, MAX_LORAS, MAX_CPU_LORAS, demo.model_dir,
                               extra=(*own_state(state), *COLD_FLAGS))
        say("cluster: starting a server scaled to zero")
        try:
            with running(cmd, port, out_dir / ".cluster-cold.log", ready_path="/ready") as base:
                async def drive():
                    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
                        cold, _ = await stream_ttft(client, _body(MODEL_ID))
                        warm, _ = await stream_ttft(client, _body(MODEL_ID))
                        return cold, warm

                cold, warm = asyncio.run(drive())
        except (RuntimeError, httpx.HTTPError) as e:
            say(f"  scale to zero failed: {e}")
            return {"error": f"{type(e).__name__}: {e}"}
    say(f"  scale to zero: first TTFT {cold:.1f} s, then {warm * 1000:.0f} ms")
    return {"first_ttft_s": round(cold, 2), "warm_ttft_ms": round(warm * 1000, 1)}


def run(out_dir: Path, quick: bool) -> dict:
    demo = demo_assets()
    adapters = many_adapters(demo.model_dir, NUM_ADAPTERS, RANK, "zipf")
    num_requests = 64 if quick else 192
    hop_requests = 10 if quick else HOP_REQUESTS
    rows = []
    for label, extra in SETUPS:
        clustered = bool(extra)
        port = free_port()
        with tempfile.TemporaryDirectory(prefix="loraplex-bench-cluster-") as state:
            cmd = loraplex_command(port, adapters, MAX_LORAS, MAX_CPU_LORAS, demo.model_dir,
                                   extra=(*own_state(state), *extra))
            say(f"cluster: starting {label}")
            started = time.monotonic()
            with running(cmd, port, out_dir / ".cluster.log", ready_path="/ready") as base:
                ready_s = time.monotonic() - started

                async def drive():
                    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
                        await stream_ttft(client, _body(MODEL_ID))  # warm-up
                        hop = await hop_latency(client, hop_requests)
                        zipf = await _zipf(client, list(adapters), num_requests, clustered)
                        return hop, zipf

                hop, zipf = asyncio.run(drive())
        say(f"  {label}: ready in {ready_s:.0f} s; zipf TTFT p50 {zipf['ttft_p50_ms']:.0f} ms, "
            f"{zipf['cold_loads']:.0f} cold loads; hop TTFT p50 {hop['ttft_p50_ms']:.1f} ms")
        rows.append({"setup": label, "ready_s": round(ready_s, 1), "zipf": zipf, "hop": hop})
    return {"num_adapters": NUM_ADAPTERS, "zipf_s": ZIPF_S, "concurrency": CONCURRENCY, "max_tokens": MAX_TOKENS,
            "max_loras": MAX_LORAS, "max_cpu_loras": MAX_CPU_LORAS, "replicas": REPLICAS, "setups": rows,
            "scale_to_zero": _cold_start(demo, out_dir)}


def _ms(value: float | None):
    return "-" if value is None else round(value, 2)


def tables(results: dict):
    cold = results.get("scale_to_zero", {})
    zipf = [[r["setup"], r["zipf"]["distinct_used"], round(r["zipf"]["cold_loads"]), _ms(r["zipf"]["ttft_p50_ms"]),
             _ms(r["zipf"]["ttft_p99_ms"]), round(r["zipf"]["output_tok_s"])] for r in results["setups"]]
    single = results["setups"][0]["hop"]
    hop = [[r["setup"], _ms(r["hop"]["ttft_p50_ms"]), _ms(r["hop"]["ttft_p50_ms"] - single["ttft_p50_ms"]),
            _ms(r["hop"]["tpot_p50_ms"]), _ms(r["hop"]["tpot_p50_ms"] - single["tpot_p50_ms"]), r["ready_s"]]
           for r in results["setups"]]
    return [
        (f"Zipf(s={results['zipf_s']}) over {results['num_adapters']} adapters, concurrency {results['concurrency']}, "
         f"{results['max_tokens']} tokens each; max_loras {results['max_loras']}, max_cpu_loras "
         f"{results['max_cpu_loras']} per engine",
         ["setup", "adapters used", "cold loads", "TTFT p50 ms", "TTFT p99 ms", "output tok/s"], zipf),
        ("The Ray hop: base model, one request at a time",
         ["setup", "TTFT p50 ms", "+ vs single", "TPOT p50 ms", "+ vs single", "ready after s"], hop),
        ("Scale to zero (0 to 1 replica): the first request waits for a replica to start",
         ["first request TTFT s", "next request TTFT ms", "error"],
         [[cold.get("first_ttft_s", "-"), cold.get("warm_ttft_ms", "-"), cold.get("error", "")]]),
    ]
