"""Scenario `noisy-neighbour`: tenant A floods at 5x its fair share; what happens to tenant B's latency?

Two tenants of equal weight share an engine that runs 8 sequences at once, so each one's fair share is 4
requests in flight. B keeps 4 in flight (closed loop); A, when present, keeps 20 in flight (5x its share) for as
long as B runs. Three servers, the same engine arguments and tenants, one after the other:

- `fair`: loraplex as configured by default: admission holds at most the engine's batch size (8) in the engine
  and queues the rest per tenant, handing free slots out by weighted fair queueing; a tenant with requests in
  flight keeps free slots up to its fair share and recent peak (its claim), so A borrows only the rest.
- `fair, no claims`: the same with `reserve_window_s: 0`, plain work-conserving fair queueing: a slot B frees
  goes to A's queue before B's client has sent its next request.
- `fifo`: the same server with admission opened to 64 running (more than A and B ever send), so every request
  goes straight to vLLM's scheduler and waits in its first-come-first-served queue, as with vLLM's own server,
  which has no notion of tenants.

Each server runs B alone, then B with A. Reported: B's TTFT (p50, p95, p99) and end-to-end latency, the share
of B's requests within the default TTFT objective, and both tenants' output tokens/s.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import httpx
from bench_servers import (
    demo_assets,
    free_port,
    loraplex_command,
    own_state,
    percentile_ms,
    running,
    say,
    stream_ttft,
)

ENGINE_BATCH, SHARE, FLOOD_FACTOR, MAX_TOKENS = 8, 4, 5, 32
TTFT_OBJECTIVE_S = 0.5  # the default objective (api/observability/slo.py DEFAULT_SLO): p95 TTFT <= 500 ms
PROMPT = "write a short answer about rivers, mountains and the sea"
TENANT_ADAPTERS = {"a": "sql-helper", "b": "support-bot"}


MODES = {  # admission settings in the tenants file
    "fair": {},
    "fair, no claims": {"reserve_window_s": 0},
    "fifo": {"max_running": 64},
}


def tenants_config(keys: dict[str, str], admission: dict) -> dict:
    """Tenants `a` and `b`, one standard priority class (equal weights), each with its own adapter."""
    from api.tenancy.keys import hash_key

    config = {
        "priority_classes": {"standard": {"weight": 1}},
        "tenants": [{"name": name, "key_hashes": [hash_key(keys[name])], "adapters": [adapter],
                     "priority": "standard"} for name, adapter in TENANT_ADAPTERS.items()],
    }
    if admission:
        config["admission"] = admission
    return config


def within(values: list[float], limit: float) -> float | None:
    """Fraction of values at or under `limit`."""
    return sum(v <= limit for v in values) / len(values) if values else None


async def _tenant_load(base: str, key: str, adapter: str, concurrency: int, num_requests: int | None,
                       stop: asyncio.Event) -> list[tuple[float, float, float, int]]:
    """(start on the perf_counter clock, TTFT s, end-to-end s, tokens) per request, in order of completion;
    `num_requests` None: until `stop` is set."""
    results: list[tuple[float, float, float, int]] = []
    body = {"model": adapter, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}
    remaining = [num_requests]

    async def worker(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            if remaining[0] is not None:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
            started = time.perf_counter()
            ttft, tokens = await stream_ttft(client, body)
            results.append((started, ttft, time.perf_counter() - started, tokens))

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits,
                                 headers={"Authorization": f"Bearer {key}"}) as client:
        await asyncio.gather(*[worker(client) for _ in range(concurrency)])
    return results


async def _phase(base: str, keys: dict[str, str], b_requests: int, with_a: bool) -> dict:
    stop = asyncio.Event()
    started = time.perf_counter()
    a_task = None
    if with_a:
        a_task = asyncio.create_task(_tenant_load(base, keys["a"], TENANT_ADAPTERS["a"], SHARE * FLOOD_FACTOR, None,
                                                  stop))
        await asyncio.sleep(1.0)  # A's queue is full before B starts
        started = time.perf_counter()
    b = await _tenant_load(base, keys["b"], TENANT_ADAPTERS["b"], SHARE, b_requests, asyncio.Event())
    b_wall = time.perf_counter() - started
    stop.set()
    # A's requests that finished while B ran; its head start and the tail after B are left out.
    a = [r for r in (await a_task if a_task is not None else []) if started <= r[0] + r[2] <= started + b_wall]
    ttft, e2e = [r[1] for r in b], [r[2] for r in b]
    return {"b_requests": len(b), "b_ttft_p50_ms": percentile_ms(ttft, 50), "b_ttft_p95_ms": percentile_ms(ttft, 95),
            "b_ttft_p99_ms": percentile_ms(ttft, 99), "b_e2e_p50_ms": percentile_ms(e2e, 50),
            "b_e2e_p99_ms": percentile_ms(e2e, 99), "b_within_ttft_objective": within(ttft, TTFT_OBJECTIVE_S),
            "b_tok_s": sum(r[3] for r in b) / b_wall, "a_requests": len(a),
            "a_tok_s": sum(r[3] for r in a) / b_wall if a else 0.0, "wall_s": b_wall,
            # [start ms after B began, TTFT ms] of each B request, by start
            "b_ttft_by_start_ms": sorted([round((r[0] - started) * 1000), round(r[1] * 1000)] for r in b)}


def run(out_dir: Path, quick: bool) -> dict:
    import yaml

    from api.tenancy.keys import generate_key

    demo = demo_assets()
    adapters = {name: demo.adapter_dirs[name] for name in TENANT_ADAPTERS.values()}
    keys = {name: generate_key() for name in TENANT_ADAPTERS}
    b_requests = 24 if quick else 96
    results = {}
    for mode, admission in MODES.items():
        with tempfile.TemporaryDirectory(prefix="loraplex-bench-nn-") as state:
            config = Path(state) / "tenants.yaml"
            config.write_text(yaml.safe_dump(tenants_config(keys, admission), sort_keys=False))
            port = free_port()
            cmd = loraplex_command(port, adapters, 4, 8, demo.model_dir, extra=(
                "--max-num-seqs", str(ENGINE_BATCH), "--config", str(config), *own_state(state)))
            say(f"noisy-neighbour: {mode} server")
            with running(cmd, port, out_dir / f".noisy-{mode.replace(', ', '-').replace(' ', '-')}.log", ready_path="/ready") as base:
                async def drive():
                    for tenant in TENANT_ADAPTERS:  # warm-up: each adapter loaded once
                        await _tenant_load(base, keys[tenant], TENANT_ADAPTERS[tenant], 1, 2, asyncio.Event())
                    return {"b_alone": await _phase(base, keys, b_requests, with_a=False),
                            "b_with_a": await _phase(base, keys, b_requests, with_a=True)}

                results[mode] = asyncio.run(drive())
            for phase, r in results[mode].items():
                say(f"  {mode} {phase}: B TTFT p99 {r['b_ttft_p99_ms']:.0f} ms, B {r['b_tok_s']:.0f} tok/s, "
                     f"A {r['a_tok_s']:.0f} tok/s")
    for phases in results.values():
        phases["b_with_a"]["b_ttft_p99_vs_alone"] = (phases["b_with_a"]["b_ttft_p99_ms"]
                                                     / phases["b_alone"]["b_ttft_p99_ms"])
    return {"engine_batch": ENGINE_BATCH, "b_concurrency": SHARE, "a_concurrency": SHARE * FLOOD_FACTOR,
            "max_tokens": MAX_TOKENS, "ttft_objective_s": TTFT_OBJECTIVE_S, "b_requests": b_requests,
            "modes": results}


def _round(value: float | None, digits: int = 0):
    if value is None:
        return "-"
    return round(value, digits) if digits else round(value)


def tables(results: dict):
    rows = []
    for mode, phases in results["modes"].items():
        for phase, r in phases.items():
            within_objective = r["b_within_ttft_objective"]
            rows.append([mode, "B alone" if phase == "b_alone" else "B + A",
                         *(_round(r[k]) for k in ("b_ttft_p50_ms", "b_ttft_p95_ms", "b_ttft_p99_ms", "b_e2e_p99_ms")),
                         "-" if within_objective is None else f"{within_objective:.0%}", round(r["b_tok_s"]),
                         round(r["a_tok_s"]), _round(r.get("b_ttft_p99_vs_alone", 1.0), 2)])
    return [(f"Tenant B ({results['b_concurrency']} in flight) alone and beside tenant A "
             f"({results['a_concurrency']} in flight)",
             ["admission", "load", "B TTFT p50 ms", "B TTFT p95 ms", "B TTFT p99 ms", "B e2e p99 ms",
              f"B TTFT <= {results['ttft_objective_s'] * 1000:.0f} ms", "B tok/s", "A tok/s",
              "B p99 TTFT vs alone"], rows)]
