"""Scenario `kernels`: offline engine throughput, vLLM's stock CPU LoRA ops vs loraplex's grouped ops, eager and
native, in an eager graph and in the compiled one.

Each variant runs in its own process (the kernel choice is made when vLLM loads plugins) with the same
engine arguments, model, adapters, prompts and sampling: 32 prompts x 64 greedy tokens, all in one batch.
Variants: `no-lora` (engine without LoRA, compiled as vLLM compiles it on CPU), `stock`, `eager` (loraplex's
grouped torch ops), `native` (loraplex's C++ kernel), all three run eagerly as vLLM runs every LoRA engine on CPU,
and `compiled` (the native kernel as custom ops in the compiled graph, loraplex's default): LoRA-enabled engines
(`LORAPLEX_LORA_KERNELS`, `LORAPLEX_LORA_COMPILE`). On the mid-size model
(`--model mid`) `stock` is left out (at a tenth of the others' speed it would take most of the run).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench_servers import MID_RANK, BenchModel, bench_model

from adapters.demo.loras import ATTENTION, MLP, DemoAdapterSpec, build_adapter
from adapters.home import data_home

NUM_PROMPTS = 32
OUTPUT_TOKENS = 64
VARIANTS = {"tiny": ("no-lora", "stock", "eager", "native", "compiled"),
            "mid": ("no-lora", "eager", "native", "compiled")}
ADAPTER_COUNTS = (1, 3, 16)
PAIRS = (("native", "eager"), ("compiled", "native"))  # compared side by side in the table
RANKS = (16, 64)
COUNT_SWEEP_RANK = 16
ENGINE_ARGS = dict(dtype="float32", max_model_len=512, max_num_seqs=NUM_PROMPTS, max_loras=16,
                   max_cpu_loras=24, max_lora_rank=64, kv_cache_memory_bytes=2**30, seed=0)


@dataclass(frozen=True)
class Workload:
    name: str
    adapters: int
    rank: int | None


def workloads(quick: bool, model: str = "tiny") -> list[Workload]:
    items = [Workload("base only", 0, None)]
    counts = (1, 3) if quick or model == "mid" else ADAPTER_COUNTS
    items += [Workload(f"{n} adapter{'s' * (n > 1)} r{COUNT_SWEEP_RANK}", n, COUNT_SWEEP_RANK) for n in counts]
    if model == "tiny":
        items += [Workload(f"3 adapters r{r}", 3, r) for r in RANKS if r != COUNT_SWEEP_RANK]
    return items


def model_adapters(demo: BenchModel) -> dict[int, list[Path]]:
    """Adapters by rank: generated for the tiny model, the mid-size model's own rank-16 ones."""
    if demo.name == "mid":
        return {MID_RANK: list(demo.adapter_dirs.values())}
    return bench_adapters(demo.model_dir, data_home())


def bench_adapters(base_dir: Path, home: Path) -> dict[int, list[Path]]:
    """16 adapters per rank (attention and MLP), generated once under the data directory."""
    root = home / "bench-adapters-v1"
    out: dict[int, list[Path]] = {}
    for rank in RANKS:
        count = max(ADAPTER_COUNTS) if rank == COUNT_SWEEP_RANK else 3
        out[rank] = []
        for i in range(count):
            path = root / f"r{rank}-{i:02d}"
            if not (path / "adapter_model.safetensors").exists():
                spec = DemoAdapterSpec(f"bench-r{rank}-{i}", rank=rank, alpha=rank, target_modules=ATTENTION + MLP,
                                       seed=1000 * rank + i)
                build_adapter(base_dir, spec, path)
            out[rank].append(path)
    return out


def _prompts(tokenizer) -> list[list[int]]:
    rng = random.Random(0)
    words = "the model adapter tenant request token stream serve batch cache engine river mountain".split()
    return [tokenizer.encode(" ".join(rng.choice(words) for _ in range(12)), add_special_tokens=False)
            for _ in range(NUM_PROMPTS)]


def worker(variant: str, out_path: Path, quick: bool, repeats: int, only: str | None = None,
           model: str = "tiny") -> None:
    """Runs inside the variant's process: one engine, every workload, `repeats` timed runs each."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    demo = bench_model(model)
    adapters = model_adapters(demo)
    enable_lora = variant != "no-lora"
    extra = {} if enable_lora else {k: v for k, v in ENGINE_ARGS.items() if "lora" not in k}
    llm = LLM(model=str(demo.model_dir), enable_lora=enable_lora, **(ENGINE_ARGS if enable_lora else extra))
    prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts(llm.get_tokenizer())]
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0, ignore_eos=True)
    results = []
    for w in workloads(quick, model):
        if (w.adapters and not enable_lora) or (only and w.name != only):
            continue
        loras = None
        if w.adapters:
            chosen = adapters[w.rank][: w.adapters]
            loras = [LoRARequest(f"r{w.rank}-{i % w.adapters}", 1 + RANKS.index(w.rank) * 100 + i % w.adapters,
                                 str(chosen[i % w.adapters])) for i in range(NUM_PROMPTS)]
        llm.generate(prompts, params, lora_request=loras, use_tqdm=False)  # warm-up, loads adapters
        rates = []
        for _ in range(repeats):
            started = time.perf_counter()
            outputs = llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
            elapsed = time.perf_counter() - started
            rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed)
        results.append({"workload": w.name, "adapters": w.adapters, "rank": w.rank, "runs": rates})
        print(f"  {variant:8s} {w.name:22s} best {max(rates):6.0f} tok/s, median {statistics.median(rates):6.0f}",
              flush=True)
    out_path.write_text(json.dumps(results))


def run_variant(variant: str, out_dir: Path, quick: bool, repeats: int, model: str) -> list[dict]:
    tmp, log = out_dir / f".kernels-{variant}.json", out_dir / f".kernels-{variant}.log"
    kernels = {"no-lora": "eager", "compiled": "native"}.get(variant, variant)
    env = {**os.environ, "LORAPLEX_LORA_KERNELS": kernels, "VLLM_CPU_KVCACHE_SPACE": "1",
           "LORAPLEX_LORA_COMPILE": "on" if variant == "compiled" else "off"}
    cmd = [sys.executable, __file__, variant, str(tmp), "1" if quick else "0", str(repeats), "", model]
    with log.open("w") as engine_log:
        done = subprocess.run(cmd, env=env, stdout=sys.stderr, stderr=engine_log)
    if done.returncode != 0:
        raise RuntimeError(f"variant {variant} failed; engine log in {log}")
    rows = json.loads(tmp.read_text())
    tmp.unlink()
    log.unlink()
    return rows


def run(out_dir: Path, quick: bool, demo: BenchModel) -> dict:
    """Variants interleaved over rounds (A B C A B C); each workload reports its best run, since on a shared
    2-core VM interference only ever slows a run down."""
    repeats, rounds = (2, 1) if quick else (2, 2)
    variants = VARIANTS[demo.name]
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, dict]] = {v: {} for v in variants}
    for round_index in range(rounds):
        for variant in variants:
            print(f"[kernels] round {round_index + 1}/{rounds}, variant {variant}: starting engine",
                  file=sys.stderr, flush=True)
            for row in run_variant(variant, out_dir, quick, repeats, demo.name):
                kept = runs[variant].setdefault(row["workload"], {**row, "runs": []})
                kept["runs"] += row["runs"]
    results = {}
    for variant, by_workload in runs.items():
        results[variant] = []
        for row in by_workload.values():
            row["output_tokens_per_s"] = max(row["runs"])
            results[variant].append(row)
    reference = results["no-lora"][0]["output_tokens_per_s"]
    for rows in results.values():
        for row in rows:
            row["vs_engine_without_lora"] = row["output_tokens_per_s"] / reference
    return {"model": demo.model_id, "engine_args": ENGINE_ARGS, "num_prompts": NUM_PROMPTS,
            "output_tokens": OUTPUT_TOKENS,
            "repeats_per_round": repeats, "rounds": rounds, "statistic": "best run", "variants": results}


def table(results: dict) -> tuple[list[str], list[list]]:
    """tok/s of every variant, each LoRA variant's ratio to the engine without LoRA (base only), native against
    eager and compiled against native. Runs saved before the eager/native split name the eager ops `grouped`."""
    by_name = {v: {r["workload"]: r for r in rows} for v, rows in results["variants"].items()}
    lora_variants = [v for v in by_name if v != "no-lora"]
    headers = (["workload"] + [f"{v} tok/s" for v in by_name] + [f"{v} / no-lora" for v in lora_variants]
               + [f"{a} / {b}" for a, b in PAIRS if {a, b} <= set(by_name)])
    rows = []
    for name in [r["workload"] for r in results["variants"][lora_variants[0]]]:
        row = [name] + [round(by_name[v][name]["output_tokens_per_s"]) if name in by_name[v] else "-" for v in by_name]
        row += [round(by_name[v][name]["vs_engine_without_lora"], 2) for v in lora_variants]
        row += [round(by_name[a][name]["output_tokens_per_s"] / by_name[b][name]["output_tokens_per_s"], 2)
                for a, b in PAIRS if {a, b} <= set(by_name)]
        rows.append(row)
    return headers, rows


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    reference = results["variants"]["no-lora"][0]["output_tokens_per_s"]
    ax.axhline(reference, color="gray", linestyle="--", label="engine without LoRA, base only")
    for variant in [v for v in results["variants"] if v != "no-lora"]:
        rows = [r for r in results["variants"][variant] if r["rank"] in (None, COUNT_SWEEP_RANK)]
        ax.plot([r["adapters"] for r in rows], [r["output_tokens_per_s"] for r in rows], marker="o",
                label=f"{variant} LoRA ops")
    ax.set_xlabel(f"distinct adapters in the batch (rank {COUNT_SWEEP_RANK}, attention + MLP; 0 = base only)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{NUM_PROMPTS} prompts x {OUTPUT_TOKENS} tokens, {results.get('model', 'tiny Llama')}, float32, CPU")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    # Also run by hand to profile one workload, e.g. under py-spy:
    #   python scripts/bench_kernels.py native /tmp/out.json 1 20 "3 adapters r16" [tiny|mid]
    worker(sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4]), (sys.argv[5:] or [None])[0] or None,
           (sys.argv[6:] or ["tiny"])[0])
