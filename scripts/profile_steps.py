"""Where an engine step's time goes: vLLM's model runner timed part by part, an engine without LoRA against the
compiled LoRA engine (loraplex's default), both serving base-model traffic only (`kernels`' "base only" workload).

    python scripts/profile_steps.py [--rounds 3] [--repeats 6] [--model tiny|mid]

Each variant runs in its own process (the kernel choice is made when vLLM loads plugins), engine in-process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so the runner's methods can be wrapped with timers; variants alternate over
rounds. Prints microseconds per engine step by part, and the LoRA engine's extra; writes
docs/results/profile-steps-STAMP.json. The parts nest (`_model_forward` is inside `execute_model`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
VARIANTS = {"no-lora": {"LORAPLEX_LORA_KERNELS": "eager", "LORAPLEX_LORA_COMPILE": "off"},
            "compiled": {"LORAPLEX_LORA_KERNELS": "native", "LORAPLEX_LORA_COMPILE": "on"}}
RUNNER_PARTS = ("execute_model", "_model_forward", "_prepare_inputs", "set_active_loras", "sample_tokens",
                "_update_states", "_bookkeeping_sync")


def per_step(seconds: dict[str, float], steps: int) -> dict[str, float]:
    """Total seconds by part -> microseconds per engine step."""
    return {part: total / steps * 1e6 for part, total in seconds.items()} if steps else {}


def summarize(rounds: list[dict[str, dict]]) -> dict:
    """Medians over rounds of each variant's tok/s and us/step by part, and the compiled engine's extra per part
    (a part the engine without LoRA never runs counts as 0 there)."""
    def median(variant: str, key: str, part: str | None = None) -> float:
        values = [r[variant][key] if part is None else r[variant][key].get(part, 0.0) for r in rounds]
        return statistics.median(values)

    parts = sorted({p for r in rounds for v in r.values() for p in v["us_per_step"]})
    out = {v: {"tok_s": median(v, "tok_s"), "us_per_step": {p: median(v, "us_per_step", p) for p in parts}}
           for v in VARIANTS}
    out["extra_us_per_step"] = {p: out["compiled"]["us_per_step"][p] - out["no-lora"]["us_per_step"][p]
                                for p in parts}
    out["tok_s_ratio"] = out["compiled"]["tok_s"] / out["no-lora"]["tok_s"]
    out["tok_s_ratio_per_round"] = [r["compiled"]["tok_s"] / r["no-lora"]["tok_s"] for r in rounds]
    return out


def worker(variant: str, out_path: Path, repeats: int, model: str) -> None:
    """Runs inside the variant's process."""
    sys.path.insert(0, str(REPO))
    from vllm.v1.worker import gpu_model_runner

    seconds: dict[str, float] = defaultdict(float)
    calls: Counter = Counter()
    timing = [False]

    def timed(name: str):
        original = getattr(gpu_model_runner.GPUModelRunner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if timing[0]:
                    seconds[name] += time.perf_counter() - started
                    calls[name] += 1
        setattr(gpu_model_runner.GPUModelRunner, name, wrapper)

    for name in RUNNER_PARTS:
        if hasattr(gpu_model_runner.GPUModelRunner, name):
            timed(name)

    import bench_kernels
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    demo = bench_kernels.bench_model(model)
    lora = variant != "no-lora"
    args = {k: v for k, v in bench_kernels.ENGINE_ARGS.items() if lora or "lora" not in k}
    llm = LLM(model=str(demo.model_dir), enable_lora=lora, **args)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in bench_kernels._prompts(llm.get_tokenizer())]
    params = SamplingParams(max_tokens=bench_kernels.OUTPUT_TOKENS, temperature=0, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    timing[0] = True
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - started))
    out_path.write_text(json.dumps({"tok_s": statistics.median(rates), "steps": calls["execute_model"],
                                    "us_per_step": per_step(seconds, calls["execute_model"])}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=6, help="timed generate calls per variant and round")
    parser.add_argument("--model", choices=("tiny", "mid"), default="tiny")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results")
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            row = {}
            for variant, env in VARIANTS.items():
                path = Path(tmp) / f"{variant}-{r}.json"
                print(f"[profile-steps] round {r + 1}/{args.rounds}: {variant}", file=sys.stderr, flush=True)
                subprocess.run([sys.executable, __file__, "--worker", variant, str(path), str(args.repeats),
                                args.model], check=True, stdout=sys.stderr, stderr=subprocess.DEVNULL,
                               env={**os.environ, **env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                                    "VLLM_CPU_KVCACHE_SPACE": "1"})
                row[variant] = json.loads(path.read_text())
            rounds.append(row)
    summary = summarize(rounds)
    from bench_report import write_run

    command = "python scripts/profile_steps.py " + " ".join(sys.argv[1:])
    path = write_run(args.out, "profile-steps", command.strip(), vars(args) | {"out": str(args.out)},
                     {"model": args.model, "rounds": rounds, "summary": summary})
    print(f"compiled LoRA engine / engine without LoRA, base-model traffic: {summary['tok_s_ratio']:.3f} "
          f"(per round {', '.join(f'{x:.3f}' for x in summary['tok_s_ratio_per_round'])})")
    print(f"{'part':20s} {'no-lora us/step':>16s} {'compiled us/step':>17s} {'extra':>8s}")
    for part, extra in sorted(summary["extra_us_per_step"].items(), key=lambda kv: -kv[1]):
        print(f"{part:20s} {summary['no-lora']['us_per_step'][part]:16.1f} "
              f"{summary['compiled']['us_per_step'][part]:17.1f} {extra:8.1f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        main()
