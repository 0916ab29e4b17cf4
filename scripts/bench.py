"""loraplex benchmark suite. Each scenario is a named entry; results go to docs/results/ and docs/benchmarks.md.

    python scripts/bench.py [SCENARIO ...] [--quick] [--model tiny|smollm2|mid] [--dtype float32|bfloat16]
    python scripts/bench.py --report docs/results/SCENARIO-STAMP.json   # tables of a saved run, into the doc

Nothing here is asserted by the test suite: numbers are measured and reported, side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_admission  # noqa: E402
import bench_batch  # noqa: E402
import bench_cluster  # noqa: E402
import bench_defaults  # noqa: E402
import bench_grpc  # noqa: E402
import bench_kernels  # noqa: E402
import bench_mixture  # noqa: E402
import bench_routing  # noqa: E402
import bench_scale  # noqa: E402
import bench_serving  # noqa: E402
import bench_structured  # noqa: E402
import bench_state  # noqa: E402
import bench_tenants  # noqa: E402
import bench_tiers  # noqa: E402
from bench_report import markdown_table, replace_section, write_run  # noqa: E402
from bench_servers import BENCH_MODELS, ENGINE, BenchModel, bench_model  # noqa: E402

from adapters.demo.smollm2 import MODEL_ID as SMOLLM2_ID  # noqa: E402
from adapters.demo.tiny_llama import MID_LLAMA  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"


Table = tuple[str, list[str], list[list]]  # caption ("" for none), headers, rows


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    run: Callable[[Path, bool, BenchModel], dict]
    tables: Callable[[dict], list[Table]]
    plot: Callable[[dict, Path], None] | None = None
    in_quick: bool = True  # part of `make bench-quick` (which must finish in under 3 minutes)
    models: tuple[str, ...] = ("tiny",)  # the demo base models it runs on (--model)
    dtypes: tuple[str, ...] = ("float32",)  # the engine dtypes it runs in (--dtype)


def on_tiny(run: Callable[[Path, bool], dict]) -> Callable[[Path, bool, BenchModel], dict]:
    """A scenario written for the tiny model, which it builds itself."""
    return lambda out_dir, quick, _model: run(out_dir, quick)


def one_table(table: Callable[[dict], tuple[list[str], list[list]]]) -> Callable[[dict], list[Table]]:
    return lambda results: [("", *table(results))]


# The scenarios whose servers take the engine dtype from bench_servers.ENGINE, so they can run in bfloat16 too.
SERVER_DTYPES = ("float32", "bfloat16")
SCENARIOS = {
    s.name: s
    for s in (
        Scenario("overhead", "loraplex vs vLLM's own OpenAI server, interleaved, same engine and adapters "
                 "(vLLM's serving benchmark as load).", bench_serving.overhead, one_table(bench_serving.overhead_table),
                 models=BENCH_MODELS, dtypes=SERVER_DTYPES),
        Scenario("lora-scaling", "Output tokens/s with 0 (base only), 1, 4 and 16 distinct adapters in the traffic.",
                 bench_serving.lora_scaling, one_table(bench_serving.lora_scaling_table),
                 bench_serving.lora_scaling_plot, models=BENCH_MODELS, dtypes=SERVER_DTYPES),
        Scenario("tiers", "Adapter tiers: TTFT and load latency by the tier an adapter is found in; output tokens/s "
                 "with 0, 1, 8 and 64 distinct adapters under Zipf traffic (max_loras 4, max_cpu_loras 16).",
                 on_tiny(bench_tiers.run), bench_tiers.tables, bench_tiers.plot, in_quick=False),
        Scenario("noisy-neighbour", "Tenant A at 5x its fair share beside tenant B: B's TTFT alone and with A, "
                 "with loraplex's fair admission and with first-come-first-served.",
                 on_tiny(bench_tenants.run), bench_tenants.tables, in_quick=False),
        Scenario("baseline-hf", "transformers + peft one request at a time vs loraplex, the same prompts.",
                 bench_serving.baseline_hf, one_table(bench_serving.baseline_hf_table), in_quick=False,
                 models=BENCH_MODELS),
        Scenario("batch", "Live TTFT with and without a running batch (interleaved rounds), and an idle engine's "
                 "throughput for the same prompts sent as one batch and sent live.",
                 on_tiny(bench_batch.run), bench_batch.tables, in_quick=False),
        Scenario("cluster", "Scale-out: 2 engine replicas on Ray Serve with adapter-affinity routing and with Ray's "
                 "default (power of two) against one engine: cold loads and TTFT under Zipf traffic over 64 adapters, "
                 "and the latency the Ray hop adds per request and per token.",
                 on_tiny(bench_cluster.run), bench_cluster.tables, in_quick=False),
        Scenario("kernels", "Offline throughput: vLLM's stock CPU LoRA ops vs loraplex's grouped ops, eager and "
                 "native, and the native kernel in the compiled graph, against an engine without LoRA.",
                 bench_kernels.run, one_table(bench_kernels.table), bench_kernels.plot, in_quick=False,
                 models=("tiny", "mid")),
        Scenario("mixed", "loraplex's server with the eager grouped ops, the native kernel and the native kernel in "
                 "the compiled graph, and vLLM's server without LoRA and with its stock LoRA ops as references, "
                 "interleaved: base-only traffic and three adapters mixed (vLLM's serving benchmark, 128 in / 64 out, "
                 "concurrency 32).", bench_serving.mixed, one_table(bench_serving.mixed_table), in_quick=False,
                 models=BENCH_MODELS, dtypes=SERVER_DTYPES),
        Scenario("state", "What shared state costs a request: limit admission in-process vs Redis, one ledger "
                 "commit in SQLite vs PostgreSQL (loopback servers, no engine).",
                 on_tiny(bench_state.run), bench_state.tables, in_quick=False),
        Scenario("routing", "The routing step's cost per request, and primary TTFT with a 100% shadow off and on "
                 "(interleaved rounds).", on_tiny(bench_routing.run), bench_routing.tables, in_quick=False),
        Scenario("scale", "1,000 registered adapters, 100 active under Zipf(1.1): throughput and TTFT against one "
                 "adapter and the base model, and greedy outputs of a sample against transformers + peft.",
                 on_tiny(bench_scale.run), bench_scale.tables, in_quick=False),
        Scenario("structured", "Structured outputs in a mixed load: loraplex and vLLM's own server, interleaved, each "
                 "with free chat requests only and with a quarter of them asking for a JSON schema (base model and "
                 "demo adapters round-robin, concurrency 16).", bench_structured.run,
                 one_table(bench_structured.table), in_quick=False),
        Scenario("admission", "Adapter-aware admission on and off, two servers side by side (interleaved rounds): "
                 "Zipf(1.1) over 64 adapters with max_loras 4 at concurrency 8 and 32, against one adapter and the "
                 "base model.", on_tiny(bench_admission.run), bench_admission.tables, in_quick=False),
        Scenario("defaults", "64 adapters under Zipf(1.1) at concurrency 8 with loraplex's default slot counts "
                 "(sized from memory budgets) against the 4 slots they replaced, two servers side by side "
                 "(interleaved rounds), against one adapter and the base model.", on_tiny(bench_defaults.run),
                 bench_defaults.tables, in_quick=False),
        Scenario("grpc", "gRPC streaming (ModelStreamInfer) against HTTP SSE on one server, interleaved rounds at "
                 "concurrency 1, 8 and 32: tok/s, TTFT and the API process's CPU per token.", bench_grpc.run,
                 one_table(bench_grpc.table), in_quick=False),
        Scenario("mixture", "A composition of ranks 16 + 8 against a plain rank-24 adapter (warm, interleaved "
                 "rounds), and the first request of a mixture named per request (build + load) against a cold "
                 "single adapter.", bench_mixture.run, bench_mixture.tables, in_quick=False),
    )
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", choices=[[], *SCENARIOS], metavar="SCENARIO",
                        help=f"scenarios to run (default: all of {', '.join(SCENARIOS)}; with --quick, those "
                        "marked quick)")
    parser.add_argument("--quick", action="store_true", help="fewer workloads and repeats, quick scenarios only")
    parser.add_argument("--model", choices=BENCH_MODELS, default="tiny",
                        help="the base model and adapters: tiny (random Llama, the default), smollm2 "
                        "(SmolLM2-135M-Instruct) or mid (a random Llama of hidden 1024, 8 layers, three rank-16 "
                        "adapters on all seven projections, generated for benchmarks); overhead, lora-scaling, "
                        "mixed and baseline-hf run on all three, kernels on tiny and mid, the others on tiny only")
    parser.add_argument("--dtype", choices=SERVER_DTYPES, default="float32",
                        help="the engines' dtype (default float32, the dtype of the exactness tests); bfloat16 for "
                        "overhead, lora-scaling and mixed only, which give it a doc section of its own")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results", help="where JSON and PNG files go (default: docs/results)")
    parser.add_argument("--no-doc", action="store_true", help="do not update docs/benchmarks.md")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: print the tables of these saved runs and put them in the doc (after a "
                        "change to how a scenario's tables read)")
    return parser


def _shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def report(scenario: Scenario, command: str, results: dict, path: Path, update_doc: bool) -> None:
    """Prints the run's tables (and draws its plot next to its JSON); updates its section of the doc (one per
    scenario, model and dtype: a run on SmolLM2 does not replace the tiny model's, nor a bfloat16 run a float32
    one)."""
    model, bf16 = results.get("model"), results.get("dtype") == "bfloat16"
    suffix = {SMOLLM2_ID: "smollm2", MID_LLAMA.model_id: "mid"}.get(model)
    title = f"### `{scenario.name}`" + (f" on `{model}`" if suffix else "") + (" in bfloat16" if bf16 else "")
    command_line = f"Command: `{command}` ({results['wall_seconds']} s). Raw results: `{_shown(path)}`."
    body = [title, "", scenario.summary, "", command_line]
    for caption, headers, rows in scenario.tables(results):
        body += ["", *([f"{caption}:", ""] if caption else []), markdown_table(headers, rows)]
    if scenario.plot is not None:
        png = path.with_suffix(".png")
        scenario.plot(results, png)
        body += ["", f"Plot: `{_shown(png)}`."]
    print("\n".join(body[4:]), flush=True)
    if update_doc:
        section = f"bench-{scenario.name}" + (f"-{suffix}" if suffix else "") + ("-bf16" if bf16 else "")
        replace_section(DOC, section, "\n".join(body))


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.report:
        for path in args.report:
            run = json.loads(path.read_text())
            report(SCENARIOS[run["scenario"]], run["command"], run["results"], path, not args.no_doc)
        return
    command = " ".join(["python scripts/bench.py", shlex.join(argv if argv is not None else sys.argv[1:])]).strip()
    default = [n for n, s in SCENARIOS.items() if (s.in_quick or not args.quick) and args.model in s.models]
    chosen = args.scenarios or default
    unsupported = [n for n in chosen if args.model not in SCENARIOS[n].models]
    if unsupported:
        build_parser().error(f"--model {args.model}: {', '.join(unsupported)} do(es) not run on it")
    unsupported = [n for n in chosen if args.dtype not in SCENARIOS[n].dtypes]
    if unsupported:
        build_parser().error(f"--dtype {args.dtype}: {', '.join(unsupported)} do(es) not run in it")
    ENGINE["dtype"] = args.dtype
    model = bench_model(args.model)
    for name in chosen:
        scenario = SCENARIOS[name]
        print(f"[bench] {name}: {scenario.summary}", file=sys.stderr, flush=True)
        started = time.monotonic()
        results = scenario.run(args.out, args.quick, model)
        results["wall_seconds"] = round(time.monotonic() - started, 1)
        results["dtype"] = args.dtype
        path = write_run(args.out, name, command, {"quick": args.quick, "model": args.model, "dtype": args.dtype},
                         results)
        report(scenario, command, results, path, not args.no_doc)
        print(f"[bench] {name}: wrote {path}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
