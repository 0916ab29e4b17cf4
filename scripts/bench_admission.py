"""Scenario `admission`: adapter-aware admission against admission in arrival order, side by side (issue 18).

Two loraplex servers run at once from the same tiny demo, 64 rank-8 adapters, `max_loras` 4, `max_cpu_loras` 16
and admission `max_running` 16; one with `admission.adapter_aware` on (the default), one with it off. Only one
is loaded at a time; rounds alternate which goes first. Each round runs, on each server, streamed greedy
completions of 32 tokens:

- `base only` and `one adapter`, concurrency 8: the reference rates;
- `Zipf, c=8`: Zipf(1.1) over the 64 adapters at concurrency 8 (under `max_running`, so nobody waits in
  admission and both modes should match: the issue's goals are read here);
- `Zipf, c=32`: the same at concurrency 32, so requests wait in admission and its order decides which adapters
  share the engine's steps.

Reported per load and mode: output tok/s, TTFT p50/p99 and adapter loads into the engine's CPU tier (medians over
rounds; the tok/s spread), and each round's aware / plain throughput ratio; the issue's goals read Zipf at c=8
against one adapter (tok/s >= 0.8x) and against the base model's TTFT p99 (<= 2x).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from dataclasses import dataclass
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
from bench_tiers import counts_delta, tier_counts, zipf_schedule

MODEL_ID = "loraplex/tiny-llama"
NUM_ADAPTERS, RANK, MAX_LORAS, MAX_CPU_LORAS, MAX_RUNNING = 64, 8, 4, 16, 16
ZIPF_S, MAX_TOKENS = 1.1, 32
PROMPT = "tell me a story about a river and a mountain"
MODES = {"aware": True, "plain": False}  # admission.adapter_aware


def tenants_config(key: str, aware: bool) -> dict:
    """One tenant that may use every model (its key also reads /metrics); admission as the mode says."""
    from api.tenancy.keys import hash_key

    return {"tenants": [{"name": "bench", "key_hashes": [hash_key(key)], "adapters": ["*"]}],
            "metrics_key_hashes": [hash_key(key)],
            "admission": {"max_running": MAX_RUNNING, "adapter_aware": aware}}


def _body(model: str) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}


async def run_load(base: str, key: str, models: list[str], concurrency: int) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=600, headers={"Authorization": f"Bearer {key}"}) as client:
        before = tier_counts((await client.get("/metrics")).text)
        started = time.perf_counter()
        results = await bounded(concurrency, [lambda m=m: stream_ttft(client, _body(m)) for m in models])
        wall = time.perf_counter() - started
        delta = counts_delta(tier_counts((await client.get("/metrics")).text), before)
    ttfts = [t for t, _ in results]
    return {"output_tok_s": sum(n for _, n in results) / wall, "ttft_p50_ms": percentile_ms(ttfts, 50),
            "ttft_p99_ms": percentile_ms(ttfts, 99), "wall_s": wall,
            "engine_loads": delta.get("cpu", {}).get("loads", 0.0)}


@dataclass(frozen=True)
class BenchServer:
    """One loraplex server of a side-by-side run: its tenants file and slot counts (None: loraplex's default)."""

    tenants: dict
    max_loras: int | None
    max_cpu_loras: int | None


def side_by_side(out_dir: Path, scenario: str, key: str, adapters: dict[str, Path], servers: dict[str, BenchServer],
                 loads: dict[str, tuple[list[str], int]], rounds: int) -> dict[str, dict[str, list[dict]]]:
    """Starts every server at once from the tiny demo, each on its own empty state; sends every adapter through
    each once (warm-up); then, per round, each load (models, concurrency) on each server, the servers' order
    alternating between rounds. Returns each server's results per load, a result per round."""
    import yaml

    demo = demo_assets()
    runs: dict[str, dict[str, list[dict]]] = {name: {load: [] for load in loads} for name in servers}
    with contextlib.ExitStack() as stack:
        bases = {}
        for name, server in servers.items():
            slug = name.replace(" ", "-")
            state = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"loraplex-bench-{scenario}-{slug}-"))
            config = Path(state) / "tenants.yaml"
            config.write_text(yaml.safe_dump(server.tenants, sort_keys=False))
            port = free_port()
            cmd = loraplex_command(port, adapters, server.max_loras, server.max_cpu_loras, demo.model_dir,
                                   extra=("--config", str(config), *own_state(state)))
            say(f"{scenario}: starting the {name} server")
            bases[name] = stack.enter_context(running(cmd, port, out_dir / f".{scenario}-{slug}.log",
                                                      ready_path="/ready"))
        for base in bases.values():  # warm-up: every adapter through the disk tier once
            asyncio.run(run_load(base, key, list(adapters) + [MODEL_ID], 8))
        for i in range(rounds):
            order = list(servers) if i % 2 == 0 else list(reversed(servers))
            for load, (models, concurrency) in loads.items():
                for name in order:
                    result = asyncio.run(run_load(bases[name], key, models, concurrency))
                    runs[name][load].append(result)
                    say(f"  round {i + 1} {name} {load}: {result['output_tok_s']:.0f} tok/s, TTFT p99 "
                        f"{result['ttft_p99_ms']:.0f} ms")
    return runs


def run(out_dir: Path, quick: bool) -> dict:
    from api.tenancy.keys import generate_key

    key = generate_key()
    adapters = many_adapters(demo_assets().model_dir, NUM_ADAPTERS, RANK, "zipf")
    names = list(adapters)
    num_requests, rounds = (48, 1) if quick else (192, 4)
    schedule = [names[i] for i in zipf_schedule(NUM_ADAPTERS, num_requests, ZIPF_S)]
    loads = {"base only, c=8": ([MODEL_ID] * num_requests, 8),
             "one adapter, c=8": ([names[0]] * num_requests, 8),
             "Zipf, c=8": (schedule, 8), "Zipf, c=32": (schedule, 32)}
    servers = {mode: BenchServer(tenants_config(key, aware), MAX_LORAS, MAX_CPU_LORAS) for mode, aware in MODES.items()}
    runs = side_by_side(out_dir, "admission", key, adapters, servers, loads, rounds)
    summary = {mode: {load: summarize(r) for load, r in by_load.items()} for mode, by_load in runs.items()}
    ratios = {load: [a["output_tok_s"] / p["output_tok_s"] for a, p in zip(runs["aware"][load], runs["plain"][load])]
              for load in loads}
    goals = {mode: {
        "zipf_c8_vs_one_adapter_tok_s": s["Zipf, c=8"]["output_tok_s"] / s["one adapter, c=8"]["output_tok_s"],
        "zipf_c8_ttft_p99_vs_base": s["Zipf, c=8"]["ttft_p99_ms"] / s["base only, c=8"]["ttft_p99_ms"],
    } for mode, s in summary.items()}
    return {"adapters": NUM_ADAPTERS, "rank": RANK, "max_loras": MAX_LORAS, "max_cpu_loras": MAX_CPU_LORAS,
            "max_running": MAX_RUNNING, "zipf_s": ZIPF_S, "max_tokens": MAX_TOKENS, "requests": num_requests,
            "rounds": rounds, "distinct_in_schedule": len(set(schedule)), "summary": summary,
            "aware_vs_plain_tok_s_by_round": ratios, "goals": goals, "runs": runs}


def summarize(results: list[dict]) -> dict:
    out = {}
    for key in ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "engine_loads"):
        values = [r[key] for r in results]
        out[key] = statistics.median(values)
        out[f"{key}_range"] = [min(values), max(values)]
    return out


def tables(results: dict):
    rows = []
    for load in results["summary"]["aware"]:
        for mode in MODES:
            s = results["summary"][mode][load]
            lo, hi = s["output_tok_s_range"]
            rows.append([load, mode, round(s["output_tok_s"]), f"{lo:.0f}-{hi:.0f}", round(s["ttft_p50_ms"]),
                         round(s["ttft_p99_ms"]), round(s["engine_loads"]),
                         " ".join(f"{r:.2f}" for r in results["aware_vs_plain_tok_s_by_round"][load])
                         if mode == "aware" else ""])
    goal_rows = [[mode, f"{g['zipf_c8_vs_one_adapter_tok_s']:.2f}", f"{g['zipf_c8_ttft_p99_vs_base']:.1f}"]
                 for mode, g in results["goals"].items()]
    return [
        (f"{results['adapters']} rank-{results['rank']} adapters ({results['distinct_in_schedule']} used by the Zipf "
         f"schedule), max_loras {results['max_loras']}, admission max_running {results['max_running']}, "
         f"{results['requests']} requests of {results['max_tokens']} tokens per load, {results['rounds']} "
         "interleaved rounds (medians; tok/s range over rounds)",
         ["load", "admission", "output tok/s", "tok/s range", "TTFT p50 ms", "TTFT p99 ms",
          "adapter loads into the engine", "aware / plain tok/s per round"], rows),
        ("Issue 18's goals for 64 adapters under Zipf with max_loras 4 (concurrency 8)",
         ["admission", "tok/s vs one adapter (goal >= 0.8)", "TTFT p99 vs base only (goal <= 2)"], goal_rows),
    ]
