"""Serving scenarios: `overhead`, `lora-scaling`, `baseline-hf`. See docs/benchmarks.md."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from pathlib import Path

import httpx
from bench_servers import (
    BenchModel,
    cpu_seconds,
    free_port,
    loraplex_command,
    many_adapters,
    running,
    running_process,
    say,
    vllm_bench,
    vllm_command,
)

# ---------------------------------------------------------------- overhead


OVERHEAD_CONCURRENCY = (1, 8, 32)


def overhead(out_dir: Path, quick: bool, demo: BenchModel) -> dict:
    """loraplex vs vLLM's own server, interleaved A B A B A B, the same engine arguments and demo adapters; each
    round's throughput ratio is kept, so their spread shows the machine's noise. The CPU time the API server
    process itself (not its engine processes) spends per output token is kept too: on 2 cores, what it uses is
    taken from the engine.

    vLLM's server runs in the same venv, so it loads loraplex's vLLM plugin too: both use the same LoRA
    ops and the difference is the serving layer.
    """
    adapters = dict(demo.adapter_dirs)
    concurrencies = (8,) if quick else OVERHEAD_CONCURRENCY
    rounds = 1 if quick else 3
    runs: dict[str, dict[int, list[dict]]] = {"loraplex": {}, "vllm": {}}
    for r in range(rounds):
        for server in ("loraplex", "vllm"):
            port = free_port()
            cmd = (loraplex_command(port, adapters, 4, 8, demo.model_dir) if server == "loraplex"
                   else vllm_command(port, demo.model_dir, demo.model_id, adapters, 4, 8))
            say(f"overhead: round {r + 1}/{rounds}, {server}: starting server")
            with running_process(cmd, port, out_dir / f".overhead-{server}.log") as (base, proc):
                for c in concurrencies:
                    cpu_before = cpu_seconds(proc.pid)
                    result = vllm_bench(base, demo.model_id, demo.model_dir, c, max(64, 4 * c), list(adapters))
                    tokens = result["output_throughput"] * result["duration"]
                    result["api_cpu_ms_per_token"] = (cpu_seconds(proc.pid) - cpu_before) * 1000 / tokens
                    runs[server].setdefault(c, []).append(result)
                    say(f"  {server:8s} c={c:2d} {result['output_throughput']:7.0f} tok/s "
                         f"ttft p50 {result['median_ttft_ms']:6.1f} ms")
    summary = []
    for c in concurrencies:
        def mean(server, key):
            return statistics.fmean(run[key] for run in runs[server][c])

        summary.append({
            "concurrency": c,
            "loraplex_tok_s": mean("loraplex", "output_throughput"),
            "vllm_tok_s": mean("vllm", "output_throughput"),
            "throughput_ratio": mean("loraplex", "output_throughput") / mean("vllm", "output_throughput"),
            "round_ratios": [ours["output_throughput"] / theirs["output_throughput"]
                             for ours, theirs in zip(runs["loraplex"][c], runs["vllm"][c], strict=True)],
            **{f"{m}_{p}_diff_ms": mean("loraplex", f"{p}_{m}_ms") - mean("vllm", f"{p}_{m}_ms")
               for m in ("ttft", "tpot") for p in ("median", "p99")},
            **{f"{server}_api_cpu_ms_per_token": mean(server, "api_cpu_ms_per_token") for server in runs},
        })
    return {"model": demo.model_id, "rounds": rounds, "adapters": list(adapters), "runs": runs, "summary": summary}


def overhead_table(results: dict):
    headers = ["concurrency", "loraplex tok/s", "vLLM tok/s", "ratio", "ratio per round", "TTFT p50 diff ms",
               "TTFT p99 diff ms", "TPOT p50 diff ms", "TPOT p99 diff ms",
               "API process CPU ms per token, loraplex / vLLM"]
    rows = [[s["concurrency"], round(s["loraplex_tok_s"]), round(s["vllm_tok_s"]), round(s["throughput_ratio"], 3),
             " / ".join(f"{r:.2f}" for r in s.get("round_ratios", [])), round(s["ttft_median_diff_ms"], 1),
             round(s["ttft_p99_diff_ms"], 1), round(s["tpot_median_diff_ms"], 2), round(s["tpot_p99_diff_ms"], 2),
             (f"{s['loraplex_api_cpu_ms_per_token']:.2f} / {s['vllm_api_cpu_ms_per_token']:.2f}"
              if "loraplex_api_cpu_ms_per_token" in s else "-")] for s in results["summary"]]
    return headers, rows


# ---------------------------------------------------------------- lora-scaling


SCALING_ADAPTERS = (0, 1, 4, 16)


def lora_scaling(out_dir: Path, quick: bool, demo: BenchModel) -> dict:
    """One loraplex server with 16 rank-16 adapters; the same load with 0 (base only), 1, 4, 16 of them."""
    adapters = many_adapters(demo.model_dir, 16, 16, "scale" if demo.name == "tiny" else f"{demo.name}-scale")
    counts = (0, 1, 4) if quick else SCALING_ADAPTERS
    port = free_port()
    results = []
    say("lora-scaling: starting server")
    with running(loraplex_command(port, adapters, 16, 16, demo.model_dir), port, out_dir / ".scaling.log") as base:
        for n in counts:
            result = vllm_bench(base, demo.model_id, demo.model_dir, 16, 48, list(adapters)[:n])
            results.append({"adapters": n, **result})
            say(f"  {n:2d} adapters {result['output_throughput']:7.0f} tok/s")
    for row in results:
        row["vs_base_only"] = row["output_throughput"] / results[0]["output_throughput"]
    return {"model": demo.model_id, "concurrency": 16, "num_prompts": 48, "rank": 16, "results": results}


def lora_scaling_table(results: dict):
    headers = ["distinct adapters", "output tok/s", "vs base only", "TTFT p50 ms", "TPOT p50 ms"]
    rows = [[r["adapters"] or "0 (base only)", round(r["output_throughput"]), round(r["vs_base_only"], 3),
             round(r["median_ttft_ms"], 1), round(r["median_tpot_ms"], 2)] for r in results["results"]]
    return headers, rows


def lora_scaling_plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["results"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["adapters"] for r in rows], [r["output_throughput"] for r in rows], marker="o")
    ax.set_xlabel("distinct adapters in the traffic (0 = base only)")
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title("loraplex, concurrency 16, rank 16 adapters")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- mixed


# loraplex's server with each LoRA path: the environment it is started with.
MIXED_VARIANTS = {
    "eager": {"LORAPLEX_LORA_KERNELS": "eager", "LORAPLEX_LORA_COMPILE": "off"},
    "native": {"LORAPLEX_LORA_KERNELS": "native", "LORAPLEX_LORA_COMPILE": "off"},
    "compiled": {"LORAPLEX_LORA_KERNELS": "native", "LORAPLEX_LORA_COMPILE": "on"},
}
MIXED_CONCURRENCY = 32


def mixed(out_dir: Path, quick: bool, demo: BenchModel) -> dict:
    """loraplex's server with each LoRA path (the eager grouped ops, the native kernel, the native kernel in the
    compiled graph) and two references, vLLM's own server without LoRA and vLLM's own server with LoRA as it ships
    (its stock ops, no loraplex plugin: `VLLM_PLUGINS` empty), interleaved over rounds: the same load with
    base-model traffic only and, on loraplex and the stock LoRA server, with the three demo adapters round-robin.
    Each round's ratios are reported, so their spread shows the machine's noise."""
    adapters = list(demo.adapter_dirs)
    rounds = 1 if quick else 3
    num_prompts = (96 if quick else 192) // (1 if demo.name == "tiny" else 2)
    runs: dict[str, list[dict]] = {k: [] for k in MIXED_VARIANTS}
    reference: list[float] = []
    stock: list[float] = []  # vLLM's server with its stock LoRA ops, the three adapters mixed

    def load(url: str, loras: list[str]) -> dict:
        return vllm_bench(url, demo.model_id, demo.model_dir, MIXED_CONCURRENCY, num_prompts, loras, input_len=128,
                          output_len=64)

    for r in range(rounds):
        port = free_port()
        say(f"mixed: round {r + 1}/{rounds}, vLLM's server without LoRA: starting")
        with running(vllm_command(port, demo.model_dir, demo.model_id, {}, 0, 0, lora=False), port,
                     out_dir / ".mixed-no-lora.log") as url:
            reference.append(load(url, [])["output_throughput"])
            say(f"  no-lora  base  {reference[-1]:7.0f} tok/s")
        port = free_port()
        say(f"mixed: round {r + 1}/{rounds}, vLLM's server with its stock LoRA ops: starting")
        with running(vllm_command(port, demo.model_dir, demo.model_id, demo.adapter_dirs, 4, 8), port,
                     out_dir / ".mixed-stock-lora.log", env={"VLLM_PLUGINS": ""}) as url:
            stock.append(load(url, adapters)["output_throughput"])
            say(f"  stock    mixed {stock[-1]:7.0f} tok/s")
        for variant, env in MIXED_VARIANTS.items():
            port = free_port()
            cmd = loraplex_command(port, demo.adapter_dirs, 4, 8, demo.model_dir)
            say(f"mixed: round {r + 1}/{rounds}, {variant}: starting server")
            with running(cmd, port, out_dir / f".mixed-{variant}.log", env=env) as url:
                row = {}
                for workload, loras in (("base", []), ("mixed", adapters)):
                    row[workload] = load(url, loras)
                    say(f"  {variant:8s} {workload:5s} {row[workload]['output_throughput']:7.0f} tok/s")
                row["ratio"] = row["mixed"]["output_throughput"] / row["base"]["output_throughput"]
                row["mixed_vs_no_lora"] = row["mixed"]["output_throughput"] / reference[-1]
                row["base_vs_no_lora"] = row["base"]["output_throughput"] / reference[-1]
                row["mixed_vs_stock_lora"] = row["mixed"]["output_throughput"] / stock[-1]
                runs[variant].append(row)
    summary = []
    for variant, rows in runs.items():
        summary.append({
            "kernel": variant,
            "base_tok_s": statistics.fmean(r["base"]["output_throughput"] for r in rows),
            "mixed_tok_s": statistics.fmean(r["mixed"]["output_throughput"] for r in rows),
            "ratio_per_round": [r["ratio"] for r in rows],
            "base_vs_no_lora_per_round": [r["base_vs_no_lora"] for r in rows],
            "mixed_vs_no_lora_per_round": [r["mixed_vs_no_lora"] for r in rows],
            "mixed_vs_stock_lora_per_round": [r["mixed_vs_stock_lora"] for r in rows],
            "mixed_ttft_p99_ms": statistics.fmean(r["mixed"]["p99_ttft_ms"] for r in rows),
            "base_ttft_p99_ms": statistics.fmean(r["base"]["p99_ttft_ms"] for r in rows),
        })
    return {"model": demo.model_id, "rounds": rounds, "adapters": adapters, "num_prompts": num_prompts,
            "concurrency": MIXED_CONCURRENCY, "input_len": 128, "output_len": 64, "no_lora_tok_s": reference,
            "stock_lora_mixed_tok_s": stock, "runs": runs, "summary": summary}


def mixed_table(results: dict):
    """Runs saved before the no-LoRA reference have no `... / no-lora` columns, those before the stock LoRA
    reference no `... / vLLM stock LoRA` column."""
    with_reference = "no_lora_tok_s" in results
    with_stock = "stock_lora_mixed_tok_s" in results
    headers = ["kernel", "base only tok/s", "3 adapters mixed tok/s", "mixed / base (mean)", "per round",
               "base TTFT p99 ms", "mixed TTFT p99 ms"]
    if with_reference:
        headers += ["base / no-lora per round", "mixed / no-lora per round"]
    if with_stock:
        headers += ["mixed / vLLM stock LoRA per round"]
    rows = []
    for s in results["summary"]:
        row = [s["kernel"], round(s["base_tok_s"]), round(s["mixed_tok_s"]),
               round(statistics.fmean(s["ratio_per_round"]), 3), ", ".join(f"{r:.3f}" for r in s["ratio_per_round"]),
               round(s["base_ttft_p99_ms"]), round(s["mixed_ttft_p99_ms"])]
        if with_reference:
            row += [", ".join(f"{r:.2f}" for r in s[key]) for key in ("base_vs_no_lora_per_round",
                                                                      "mixed_vs_no_lora_per_round")]
        if with_stock:
            row += [", ".join(f"{r:.1f}" for r in s["mixed_vs_stock_lora_per_round"])]
        rows.append(row)
    return headers, rows


# ---------------------------------------------------------------- baseline-hf


def baseline_hf(out_dir: Path, quick: bool, demo: BenchModel) -> dict:
    """What a user without a serving engine does: transformers + peft, one request at a time, switching
    adapters, vs loraplex serving the same prompts concurrently."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = [None, *demo.adapter_dirs]
    num_prompts, max_tokens = (8, 32) if quick else (32, 32)
    tokenizer = AutoTokenizer.from_pretrained(demo.model_dir)
    rng = random.Random(0)
    words = "the model adapter river mountain story code data music city".split()
    prompts = [tokenizer.encode(" ".join(rng.choice(words) for _ in range(16)), add_special_tokens=False)
               for _ in range(num_prompts)]
    plan = [(names[i % len(names)], p) for i, p in enumerate(prompts)]

    say("baseline-hf: transformers + peft, one request at a time")
    base = AutoModelForCausalLM.from_pretrained(demo.model_dir, dtype=torch.float32)
    first, *rest = demo.adapter_dirs.items()
    model = PeftModel.from_pretrained(base, first[1], adapter_name=first[0])
    for name, path in rest:
        model.load_adapter(path, adapter_name=name)
    model.eval()
    started = time.perf_counter()
    hf_tokens = 0
    with torch.no_grad():
        for adapter, ids in plan:
            kwargs = dict(input_ids=torch.tensor([ids]), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                          do_sample=False, pad_token_id=tokenizer.pad_token_id)
            if adapter is None:
                with model.disable_adapter():
                    out = model.generate(**kwargs)
            else:
                model.set_adapter(adapter)
                out = model.generate(**kwargs)
            hf_tokens += out.shape[1] - len(ids)
    hf_wall = time.perf_counter() - started

    port = free_port()
    say("baseline-hf: loraplex, the same prompts, all at once")
    with running(loraplex_command(port, demo.adapter_dirs, 4, 8, demo.model_dir), port, out_dir / ".hf.log") as url:
        async def drive():
            async with httpx.AsyncClient(base_url=url, timeout=300) as client:
                bodies = [{"model": adapter or demo.model_id, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True} for adapter, ids in plan]
                await client.post("/v1/completions", json=bodies[0])  # warm-up
                started = time.perf_counter()
                responses = await asyncio.gather(*[client.post("/v1/completions", json=b) for b in bodies])
                wall = time.perf_counter() - started
                return sum(r.json()["usage"]["completion_tokens"] for r in responses), wall

        lp_tokens, lp_wall = asyncio.run(drive())
    return {"prompts": num_prompts, "max_tokens": max_tokens, "models": [n or demo.model_id for n in names],
            "hf_tok_s": hf_tokens / hf_wall, "loraplex_tok_s": lp_tokens / lp_wall,
            "ratio": (lp_tokens / lp_wall) / (hf_tokens / hf_wall)}


def baseline_hf_table(results: dict):
    return (["transformers + peft tok/s", "loraplex tok/s", "loraplex / HF"],
            [[round(results["hf_tok_s"]), round(results["loraplex_tok_s"]), round(results["ratio"], 2)]])
