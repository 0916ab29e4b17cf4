"""Scenario `tiers`: what it costs to serve an adapter from each cache tier, and throughput under Zipf traffic.

Three parts on one loraplex server whose registry, disk cache and ledger start empty (a temporary folder):

1. Probes, one request at a time on an idle server. Each probe adapter is served from each tier in turn:
   `store` (never fetched: copied from the registry's store to the disk cache, hash-checked, validated, loaded
   into the engine), `engine` (it just ran, so it holds a slot), `cpu` (in the engine's CPU cache, no slot:
   after an admin evict and an admin load) and `disk` (evicted from the engine, still in the disk cache). Before
   each probe the admin API says where the adapter is resident, so a probe that was not in the tier it names
   is reported, not silently counted.
2. Load latency from each tier as the server measures it (the admin `load` call runs the same code as a
   request: fetch, validate, `add_lora`) for a fresh set of adapters (`store`) and for evicted ones (`disk`).
3. Output tokens/s and TTFT with 0 (base only), 1, 8 and 64 distinct adapters under Zipf popularity, with the
   server's own per-tier hit and miss counts for each run.
"""

from __future__ import annotations

import asyncio
import random
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

MODEL_ID = "loraplex/tiny-llama"
MAX_LORAS, MAX_CPU_LORAS, RANK = 4, 16, 8
ZIPF_S, ZIPF_COUNTS, ZIPF_CONCURRENCY, MAX_TOKENS = 1.1, (0, 1, 8, 64), 8, 32
PROBE_TIERS = ("store", "engine", "cpu", "disk")  # the order each probe adapter goes through
WARM_TO_COLD = ("engine", "cpu", "disk", "store")  # the order tables and plots show
# What `GET /v1/adapters/{name}` says is resident (engine tiers only) just before a probe of each tier.
EXPECTED_RESIDENT = {"store": [], "engine": ["cpu", "engine"], "cpu": ["cpu"], "disk": []}
PROMPT = "tell me a story about a river and a mountain"


def zipf_schedule(num_adapters: int, num_requests: int, s: float, seed: int = 0) -> list[int]:
    """Adapter index per request, P(k) proportional to 1 / (k + 1) ** s."""
    rng = random.Random(seed)
    weights = [1 / (k + 1) ** s for k in range(num_adapters)]
    return rng.choices(range(num_adapters), weights=weights, k=num_requests)


def tier_counts(metrics_text: str) -> dict[str, dict[str, float]]:
    """Adapter cache hits and misses per tier, summed over adapters, from a /metrics page; plus the load
    histogram's count and sum per tier."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    wanted = {"loraplex_adapter_cache_hits_total": "hits", "loraplex_adapter_cache_misses_total": "misses",
              "loraplex_adapter_load_seconds_count": "loads", "loraplex_adapter_load_seconds_sum": "load_seconds"}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                tier = out.setdefault(sample.labels["tier"], {})
                tier[key] = tier.get(key, 0.0) + sample.value
    return out


def counts_delta(after: dict, before: dict) -> dict[str, dict[str, float]]:
    return {tier: {k: v - before.get(tier, {}).get(k, 0.0) for k, v in values.items()}
            for tier, values in after.items()}


def found_in(delta: dict[str, dict[str, float]]) -> str | None:
    """The tier one request's adapter was found in, from the change in the server's hit and miss counts:
    the fastest tier with a hit, or `store` when the disk tier missed (a fetch)."""
    for tier in ("engine", "cpu", "disk"):
        if delta.get(tier, {}).get("hits", 0) > 0:
            return tier
    return "store" if delta.get("disk", {}).get("misses", 0) > 0 else None


def _body(model: str) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}


async def _resident(client: httpx.AsyncClient, name: str) -> list[str]:
    response = await client.get(f"/v1/adapters/{name}")
    response.raise_for_status()
    return response.json()["versions"][-1]["resident"]


async def _admin(client: httpx.AsyncClient, name: str, action: str) -> dict:
    response = await client.post(f"/v1/adapters/{name}@1/{action}")
    response.raise_for_status()
    return response.json()


async def _probe(client: httpx.AsyncClient, name: str) -> list[dict]:
    rows = []

    async def ttft(tier: str) -> None:
        resident = await _resident(client, name)
        before = tier_counts((await client.get("/metrics")).text)
        seconds, tokens = await stream_ttft(client, _body(name))
        found = found_in(counts_delta(tier_counts((await client.get("/metrics")).text), before))
        rows.append({"adapter": name, "tier": tier, "ttft_s": seconds, "tokens": tokens, "resident_before": resident,
                     "found_in": found, "as_expected": resident == EXPECTED_RESIDENT[tier] and found == tier})

    await ttft("store")
    await ttft("engine")
    await _admin(client, name, "evict")
    await _admin(client, name, "load")
    await ttft("cpu")
    await _admin(client, name, "evict")
    await ttft("disk")
    return rows


async def _loads(client: httpx.AsyncClient, fresh: list[str]) -> list[dict]:
    """Server-measured load time from the store (first load) and from disk (after an evict)."""
    rows = []
    for name in fresh:
        first = await _admin(client, name, "load")
        await _admin(client, name, "evict")
        again = await _admin(client, name, "load")
        await _admin(client, name, "evict")
        rows += [{"adapter": name, "found_in": r["found_in"], "load_s": r["load_seconds"]} for r in (first, again)]
    return rows


async def _zipf_run(client: httpx.AsyncClient, names: list[str], count: int, num_requests: int) -> dict:
    models = [MODEL_ID] * num_requests if count == 0 else [names[i] for i in zipf_schedule(count, num_requests, ZIPF_S)]
    before = tier_counts((await client.get("/metrics")).text)
    jobs = [lambda m=m: stream_ttft(client, _body(m)) for m in models]
    started = time.perf_counter()
    results = await bounded(ZIPF_CONCURRENCY, jobs)
    wall = time.perf_counter() - started
    after = tier_counts((await client.get("/metrics")).text)
    ttfts = [t for t, _ in results]
    return {"distinct_adapters": count, "requests": num_requests, "distinct_used": len(set(models)),
            "output_tok_s": sum(n for _, n in results) / wall, "wall_s": wall,
            "ttft_p50_ms": percentile_ms(ttfts, 50), "ttft_p99_ms": percentile_ms(ttfts, 99),
            "tiers": counts_delta(after, before)}


def run(out_dir: Path, quick: bool) -> dict:
    demo = demo_assets()
    zipf_adapters = many_adapters(demo.model_dir, max(ZIPF_COUNTS), RANK, "zipf")
    num_probes = 4 if quick else 16
    probe_adapters = many_adapters(demo.model_dir, 2 * num_probes, RANK, "probe")
    probe_names, load_names = list(probe_adapters)[:num_probes], list(probe_adapters)[num_probes:]
    num_requests = 48 if quick else 128
    adapter_bytes = sum(f.stat().st_size for f in next(iter(zipf_adapters.values())).iterdir())
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-tiers-") as state:
        cmd = loraplex_command(port, {**zipf_adapters, **probe_adapters}, MAX_LORAS, MAX_CPU_LORAS, demo.model_dir,
                               extra=own_state(state))
        say(f"tiers: starting server with {len(zipf_adapters) + len(probe_adapters)} adapters, empty disk cache")
        with running(cmd, port, out_dir / ".tiers.log") as base:
            async def drive():
                async with httpx.AsyncClient(base_url=base, timeout=300) as client:
                    await stream_ttft(client, _body(MODEL_ID))  # warm-up: the base model's first request
                    probes = []
                    for name in probe_names:
                        probes += await _probe(client, name)
                    say(f"  probes done: {len(probes)}")
                    loads = await _loads(client, load_names)
                    runs = []
                    for count in ZIPF_COUNTS:
                        runs.append(await _zipf_run(client, list(zipf_adapters), count, num_requests))
                        say(f"  zipf {count:2d} adapters: {runs[-1]['output_tok_s']:.0f} tok/s")
                    return probes, loads, runs

            probes, loads, runs = asyncio.run(drive())
    by_tier = {}
    for tier in PROBE_TIERS:
        values = [p["ttft_s"] for p in probes if p["tier"] == tier and p["as_expected"]]
        by_tier[tier] = {"count": len(values), "ttft_p50_ms": percentile_ms(values, 50),
                         "ttft_p99_ms": percentile_ms(values, 99),
                         "not_as_expected": sum(1 for p in probes if p["tier"] == tier and not p["as_expected"])}
    load_by_tier = {}
    for tier in ("store", "disk"):
        values = [r["load_s"] for r in loads if r["found_in"] == tier]
        load_by_tier[tier] = {"count": len(values), "p50_ms": percentile_ms(values, 50),
                              "p99_ms": percentile_ms(values, 99)}
    return {"max_loras": MAX_LORAS, "max_cpu_loras": MAX_CPU_LORAS, "rank": RANK, "adapter_bytes": adapter_bytes,
            "zipf_s": ZIPF_S, "concurrency": ZIPF_CONCURRENCY, "max_tokens": MAX_TOKENS,
            "ttft_by_tier": by_tier, "load_by_tier": load_by_tier, "zipf": runs, "probes": probes, "loads": loads}


def _ms(value: float | None):
    if value is None:
        return "-"
    return round(value) if value >= 100 else round(value, 1)


def tables(results: dict):
    by_tier, load_by_tier = results["ttft_by_tier"], results["load_by_tier"]
    ttft = [[t, by_tier[t]["count"], _ms(by_tier[t]["ttft_p50_ms"]), _ms(by_tier[t]["ttft_p99_ms"]),
             by_tier[t]["not_as_expected"]] for t in WARM_TO_COLD]
    loads = [[t, load_by_tier[t]["count"], _ms(load_by_tier[t]["p50_ms"]), _ms(load_by_tier[t]["p99_ms"])]
             for t in WARM_TO_COLD if t in load_by_tier]
    zipf = []
    for r in results["zipf"]:
        tiers = r["tiers"]
        cpu = tiers.get("cpu", {})
        zipf.append([r["distinct_adapters"] or "0 (base only)", r["distinct_used"], round(r["output_tok_s"]),
                     _ms(r["ttft_p50_ms"]), _ms(r["ttft_p99_ms"]),
                     *(int(tiers.get(t, {}).get("hits", 0)) for t in ("engine", "cpu", "disk")),
                     int(tiers.get("disk", {}).get("misses", 0)), int(cpu.get("loads", 0)),
                     _ms(1000 * cpu["load_seconds"] / cpu["loads"]) if cpu.get("loads") else "-"])
    return [
        ("TTFT of one request on an idle server, by the tier the adapter was found in",
         ["tier", "probes", "TTFT p50 ms", "TTFT p99 ms", "probes not in that tier (left out)"], ttft),
        ("Adapter load latency as the server measures it (fetch if needed, validate, load into the engine)",
         ["loaded from", "loads", "p50 ms", "p99 ms"], loads),
        (f"Zipf(s={results['zipf_s']}) traffic, concurrency {results['concurrency']}, {results['max_tokens']} "
         "output tokens; hits per tier from the server's /metrics",
         ["distinct adapters", "used", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "engine hits", "cpu hits",
          "disk hits", "store fetches", "loads into the engine", "mean load ms"], zipf),
    ]


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    tiers = [t for t in WARM_TO_COLD if results["ttft_by_tier"][t]["ttft_p50_ms"] is not None]
    p50 = [results["ttft_by_tier"][t]["ttft_p50_ms"] for t in tiers]
    p99 = [results["ttft_by_tier"][t]["ttft_p99_ms"] for t in tiers]
    x = range(len(tiers))
    left.bar([i - 0.2 for i in x], p50, width=0.4, label="p50")
    left.bar([i + 0.2 for i in x], p99, width=0.4, label="p99")
    left.set_xticks(list(x), tiers)
    left.set_xlabel("tier the adapter was found in")
    left.set_ylabel("TTFT ms (idle server)")
    left.legend()
    runs = results["zipf"]
    labels = [str(r["distinct_adapters"]) for r in runs]
    right.bar(labels, [r["output_tok_s"] for r in runs])
    right.set_xlabel("distinct adapters in the Zipf traffic (0 = base only)")
    right.set_ylabel("output tokens/s")
    fig.suptitle(f"loraplex adapter tiers: max_loras {results['max_loras']}, max_cpu_loras {results['max_cpu_loras']}, "
                 f"rank {results['rank']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
