"""Scenario `routing`: what the routing step costs, and whether a shadow delays the requests it copies.

- Routing step overhead: `Traffic.decide` in process (the per-request decision on the event loop: a cached
  rollout lookup, two SHA-256 hashes, the fallback chain), for a bare name without a rollout, with a 10% canary,
  and with a sticky A/B; beside it, what the request already paid before this step (`ModelResolver.resolve`, two
  SQLite reads) and what each routed request adds off the loop after it ends (`observe`: one SQLite write).
- Shadow: one server, `bench` at version 1 (stable) with version 2 as a 0% candidate; rounds alternate a
  100% shadow on and off (interleaved, so drift of a busy machine hits both alike). Each round a closed loop of
  primary requests (streamed, TTFT measured at the first chunk); reported: primary TTFT p50/p95/p99 and e2e p95
  per setting, and how many shadows completed, were skipped (no idle slot) or preempted (a primary had to wait).
"""

from __future__ import annotations

import asyncio
import re
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from bench_servers import demo_assets, free_port, loraplex_command, own_state, percentile_ms, running, say, stream_ttft

ENGINE_BATCH, CONCURRENCY, MAX_TOKENS = 8, 4, 32
PROMPT = "write a short answer about rivers, mountains and the sea"
MICRO_ITERATIONS = 20_000


def _publish(state: Path, demo) -> None:
    from adapters.base_model import base_model_spec
    from adapters.registry import Registry, RegistryConfig

    config = RegistryConfig(store_uri=str(state / "blobs"), index_url=str(state / "index.sqlite"))
    registry = Registry.from_config(config, base_model_spec(demo.model_dir), max_lora_rank=64)
    registry.push(demo.adapter_dirs["sql-helper"], "bench")
    registry.push(demo.adapter_dirs["support-bot"], "bench")
    registry.promote("bench", 1)
    registry.close()


def micro(demo) -> dict:
    """Microseconds per call of the routing decision and its neighbours, in this process."""
    from prometheus_client import CollectorRegistry

    from adapters.base_model import base_model_spec
    from adapters.registry import Registry, RegistryConfig
    from adapters.rollouts import RolloutStore
    from api.generation.accounting import OutcomeSink, RequestAccount
    from api.generation.resolve import ModelResolver, everything
    from api.routing.config import RoutingConfig
    from api.routing.metrics import RoutingMetrics
    from api.routing.traffic import Traffic

    with tempfile.TemporaryDirectory(prefix="loraplex-bench-route-") as state:
        _publish(Path(state), demo)
        config = RegistryConfig(store_uri=f"{state}/blobs", index_url=f"{state}/index.sqlite")
        registry = Registry.from_config(config, base_model_spec(demo.model_dir), max_lora_rank=64)
        store = RolloutStore(registry.index)
        traffic = Traffic(registry, store, RoutingConfig(rollout_refresh_s=3600),
                               RoutingMetrics(CollectorRegistry(), lambda label: label))
        resolver = ModelResolver(registry.base.model_id, registry)
        resolved = resolver.resolve("bench")

        def per_call_us(work, n: int) -> float:
            started = time.perf_counter()
            for i in range(n):
                work(i)
            return (time.perf_counter() - started) / n * 1e6

        def decide(i: int) -> None:
            traffic.decide(resolved, "acme", f"user-{i % 100}", f"req-{i}", everything)
            traffic._routes.pop(f"req-{i}")  # what `observe` does once the request ends

        results = {"resolve_us": per_call_us(lambda i: resolver.resolve("bench"), MICRO_ITERATIONS // 4)}
        traffic.invalidate()
        results["decide_no_rollout_us"] = per_call_us(decide, MICRO_ITERATIONS)
        for label, sticky in (("canary", False), ("ab", True)):
            rollout = store.start("bench", 2, 10 if not sticky else 50, sticky=sticky)
            traffic.invalidate()
            results[f"decide_{label}_us"] = per_call_us(decide, MICRO_ITERATIONS)
            if label == "canary":
                def observe(i: int) -> None:
                    traffic.decide(resolved, "acme", None, f"obs-{i}", everything)
                    account = RequestAccount(OutcomeSink([]), f"obs-{i}", model="bench", version="1")
                    traffic.observe(account.finish(200))
                results["decide_and_observe_us"] = per_call_us(observe, MICRO_ITERATIONS // 10)
            store.end("bench", "aborted", "bench", rollout_id=rollout.id)
        started = time.perf_counter()
        traffic.invalidate()
        traffic.refresh()
        results["refresh_us"] = (time.perf_counter() - started) * 1e6
        registry.close()
    return {k: round(v, 2) for k, v in results.items()}


async def _round(base: str, n: int) -> list[tuple[float, float]]:
    body = {"model": "bench", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}
    results: list[tuple[float, float]] = []
    remaining = [n]

    async def worker(client: httpx.AsyncClient) -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            started = time.perf_counter()
            ttft, _ = await stream_ttft(client, body)
            results.append((ttft, time.perf_counter() - started))

    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
        await asyncio.gather(*[worker(client) for _ in range(CONCURRENCY)])
    return results


def _shadow_counts(metrics: str) -> dict[str, float]:
    counts = {}
    for outcome, value in re.findall(r'loraplex_shadow_requests_total\{adapter="bench",outcome="(\w+)"\} ([0-9.e+]+)',
                                     metrics):
        counts[outcome] = float(value)
    return counts


def shadow(demo, out_dir: Path, quick: bool) -> dict:
    rounds, per_round = (3, 16) if quick else (6, 32)
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-shadow-") as state:
        _publish(Path(state), demo)
        port = free_port()
        cmd = loraplex_command(port, {}, 4, 8, demo.model_dir,
                               extra=("--max-num-seqs", str(ENGINE_BATCH), *own_state(state)))
        say("routing: shadow server")
        with running(cmd, port, out_dir / ".routing-shadow.log", ready_path="/ready") as base:
            admin = httpx.Client(base_url=base, timeout=60)

            def set_shadow(percent: float) -> None:
                admin.post("/v1/adapters/bench/rollout/abort")
                response = admin.post("/v1/adapters/bench/rollout", json={"candidate": 2, "percent": 0,
                                                                          "shadow_percent": percent})
                response.raise_for_status()

            samples: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
            set_shadow(100)
            asyncio.run(_round(base, 8))  # warm-up: both versions loaded
            for i in range(rounds):
                for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
                    set_shadow(100 if mode == "on" else 0)
                    samples[mode] += asyncio.run(_round(base, per_round))
                    say(f"  round {i + 1}/{rounds} shadow {mode}")
            counts = _shadow_counts(admin.get("/metrics").text)
            admin.close()
    out = {}
    for mode, rows in samples.items():
        ttft, e2e = [r[0] for r in rows], [r[1] for r in rows]
        out[mode] = {"requests": len(rows), "ttft_p50_ms": percentile_ms(ttft, 50),
                     "ttft_p95_ms": percentile_ms(ttft, 95), "ttft_p99_ms": percentile_ms(ttft, 99),
                     "e2e_p95_ms": percentile_ms(e2e, 95), "ttft_mean_ms": statistics.fmean(ttft) * 1000}
    return {"rounds": rounds, "per_round": per_round, "concurrency": CONCURRENCY, "engine_batch": ENGINE_BATCH,
            "max_tokens": MAX_TOKENS, "modes": out, "shadows": counts}


def run(out_dir: Path, quick: bool) -> dict:
    demo = demo_assets()
    say("routing: routing step microbenchmark")
    return {"micro": micro(demo), "shadow": shadow(demo, out_dir, quick)}


def tables(results: dict):
    m = results["micro"]
    micro_rows = [["resolve `model` (before the step, 2 SQLite reads)", m["resolve_us"]],
                  ["decide: bare name, no rollout", m["decide_no_rollout_us"]],
                  ["decide: 10% canary", m["decide_canary_us"]],
                  ["decide: sticky A/B", m["decide_ab_us"]],
                  ["decide + observe (canary; observe runs after the response, off the loop)",
                   m["decide_and_observe_us"]],
                  ["refresh of the rollout cache (once per rollout_refresh_s)", m["refresh_us"]]]
    s = results["shadow"]
    shadow_rows = [[mode, r["requests"], *(round(r[k]) for k in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms",
                                                                 "e2e_p95_ms"))]
                   for mode, r in s["modes"].items()]
    counts = ", ".join(f"{k} {int(v)}" for k, v in sorted(s["shadows"].items())) or "none"
    return [("Routing step, microseconds per request (in process)", ["step", "us"], micro_rows),
            (f"Primary requests with a 100% shadow off and on ({s['rounds']} interleaved rounds of {s['per_round']}, "
             f"{s['concurrency']} in flight, engine batch {s['engine_batch']}, {s['max_tokens']} tokens; shadows: "
             f"{counts})", ["shadow", "requests", "TTFT p50 ms", "TTFT p95 ms", "TTFT p99 ms", "e2e p95 ms"],
             shadow_rows)]
