"""Scenario `defaults`: 64 adapters under Zipf(1.1) with loraplex's default slot counts, against the 4 slots they
replaced (issue 31, item 4).

Two loraplex servers from the same tiny demo and 64 rank-8 adapters: one given no `--max-loras` /
`--max-cpu-loras` (sized from the memory budgets, `engine/lora_budget.py`), one with `--max-loras 4
--max-cpu-loras 8`, the defaults before. Admission is the default on both. Only one is loaded at a time; rounds
alternate which goes first. Each round runs, on each server, streamed greedy completions of 32 tokens at
concurrency 8: base model only, one adapter, and Zipf(1.1) over the 64.

Reported per load and server: output tok/s, TTFT p50/p99 and adapter loads into the engine's CPU tier (medians over
rounds; the tok/s spread); the goals read Zipf against one adapter (tok/s >= 0.8x) and against the base model's
TTFT p99 (<= 2x), per server.
"""

from __future__ import annotations

from pathlib import Path

from bench_admission import MAX_TOKENS, MODEL_ID, NUM_ADAPTERS, RANK, ZIPF_S, BenchServer, side_by_side, summarize
from bench_servers import ENGINE, demo_assets, many_adapters
from bench_tiers import zipf_schedule

# name -> (max_loras, max_cpu_loras); None: loraplex's default.
SERVERS = {"defaults": (None, None), "4 slots": (4, 8)}
CONCURRENCY = 8


def tenants_config(key: str) -> dict:
    """One tenant that may use every model; its key also reads /metrics. Admission as loraplex defaults it."""
    from api.tenancy.keys import hash_key

    return {"tenants": [{"name": "bench", "key_hashes": [hash_key(key)], "adapters": ["*"]}],
            "metrics_key_hashes": [hash_key(key)]}


def run(out_dir: Path, quick: bool) -> dict:
    from api.tenancy.keys import generate_key
    from engine.config import EngineConfig

    demo = demo_assets()
    key = generate_key()
    adapters = many_adapters(demo.model_dir, NUM_ADAPTERS, RANK, "zipf")
    names = list(adapters)
    num_requests, rounds = (48, 1) if quick else (192, 3)
    schedule = [names[i] for i in zipf_schedule(NUM_ADAPTERS, num_requests, ZIPF_S)]
    loads = {"base only": ([MODEL_ID] * num_requests, CONCURRENCY),
             "one adapter": ([names[0]] * num_requests, CONCURRENCY), "Zipf": (schedule, CONCURRENCY)}
    # What the defaults server is started with, as its own config sizes it (same checkpoint, flags and machine).
    sized = EngineConfig(model=str(demo.model_dir), **ENGINE)
    slots = {name: (given[0] or sized.max_loras, given[1] or sized.max_cpu_loras) for name, given in SERVERS.items()}
    servers = {name: BenchServer(tenants_config(key), *given) for name, given in SERVERS.items()}
    runs = side_by_side(out_dir, "defaults", key, adapters, servers, loads, rounds)
    summary = {name: {load: summarize(r) for load, r in by_load.items()} for name, by_load in runs.items()}
    goals = {name: {
        "zipf_vs_one_adapter_tok_s": s["Zipf"]["output_tok_s"] / s["one adapter"]["output_tok_s"],
        "zipf_ttft_p99_vs_base": s["Zipf"]["ttft_p99_ms"] / s["base only"]["ttft_p99_ms"],
    } for name, s in summary.items()}
    return {"adapters": NUM_ADAPTERS, "rank": RANK, "zipf_s": ZIPF_S, "concurrency": CONCURRENCY,
            "max_tokens": MAX_TOKENS, "requests": num_requests, "rounds": rounds,
            "distinct_in_schedule": len(set(schedule)),
            "servers": {name: {"max_loras": m, "max_cpu_loras": c} for name, (m, c) in slots.items()},
            "summary": summary, "goals": goals, "runs": runs}


def tables(results: dict):
    rows = []
    for load in next(iter(results["summary"].values())):
        for name, by_load in results["summary"].items():
            s = by_load[load]
            lo, hi = s["output_tok_s_range"]
            rows.append([load, name, round(s["output_tok_s"]), f"{lo:.0f}-{hi:.0f}", round(s["ttft_p50_ms"]),
                         round(s["ttft_p99_ms"]), round(s["engine_loads"])])
    goal_rows = [[name, f"{g['zipf_vs_one_adapter_tok_s']:.2f}", f"{g['zipf_ttft_p99_vs_base']:.1f}"]
                 for name, g in results["goals"].items()]
    servers = "; ".join(f"{name}: max_loras {s['max_loras']}, max_cpu_loras {s['max_cpu_loras']}"
                        for name, s in results["servers"].items())
    return [
        (f"{results['adapters']} rank-{results['rank']} adapters ({results['distinct_in_schedule']} used by the Zipf "
         f"schedule); {servers}; {results['requests']} requests of {results['max_tokens']} tokens per load at "
         f"concurrency {results['concurrency']}, {results['rounds']} interleaved rounds (medians; tok/s range over "
         "rounds)",
         ["load", "server", "output tok/s", "tok/s range", "TTFT p50 ms", "TTFT p99 ms",
          "adapter loads into the engine"], rows),
        ("Issue 31's goals for 64 adapters under Zipf(1.1) with the defaults",
         ["server", "Zipf tok/s vs one adapter (goal >= 0.8)", "Zipf TTFT p99 vs base only (goal <= 2)"], goal_rows),
    ]
