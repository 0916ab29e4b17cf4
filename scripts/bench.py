"""loraplex benchmark suite. Each scenario is a named entry; results go to docs/results/ and docs/benchmarks.md.

    python scripts/bench.py [SCENARIO ...] [--quick]

Nothing here is asserted by the test suite: numbers are measured and reported, side by side in one run.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_kernels  # noqa: E402
import bench_serving  # noqa: E402
from bench_report import markdown_table, replace_section, write_run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    run: Callable[[Path, bool], dict]
    table: Callable[[dict], tuple[list[str], list[list]]]
    plot: Callable[[dict, Path], None] | None = None
    in_quick: bool = True  # part of `make bench-quick` (which must finish in under 3 minutes)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("overhead", "loraplex vs vLLM's own OpenAI server, interleaved, same engine and adapters "
                 "(vLLM's serving benchmark as load).", bench_serving.overhead, bench_serving.overhead_table),
        Scenario("lora-scaling", "Output tokens/s with 0 (base only), 1, 4 and 16 distinct adapters in the traffic.",
                 bench_serving.lora_scaling, bench_serving.lora_scaling_table, bench_serving.lora_scaling_plot),
        Scenario("zipf", "64 adapters, Zipf popularity, max_loras 4 and max_cpu_loras 16: TTFT cold vs warm.",
                 bench_serving.zipf, bench_serving.zipf_table, in_quick=False),
        Scenario("baseline-hf", "transformers + peft one request at a time vs loraplex, the same prompts.",
                 bench_serving.baseline_hf, bench_serving.baseline_hf_table, in_quick=False),
        Scenario("kernels", "Offline throughput: vLLM's stock CPU LoRA ops vs loraplex's grouped ops.",
                 bench_kernels.run, bench_kernels.table, bench_kernels.plot, in_quick=False),
    )
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", choices=[[], *SCENARIOS], metavar="SCENARIO",
                        help=f"scenarios to run (default: all of {', '.join(SCENARIOS)}; with --quick, those "
                        "marked quick)")
    parser.add_argument("--quick", action="store_true", help="fewer workloads and repeats, quick scenarios only")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results", help="where JSON and PNG files go (default: docs/results)")
    parser.add_argument("--no-doc", action="store_true", help=f"do not update {DOC.relative_to(REPO)}")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    command = " ".join(["python scripts/bench.py", shlex.join(argv if argv is not None else sys.argv[1:])]).strip()
    default = [n for n, s in SCENARIOS.items() if s.in_quick or not args.quick]
    for name in args.scenarios or default:
        scenario = SCENARIOS[name]
        print(f"[bench] {name}: {scenario.summary}", file=sys.stderr, flush=True)
        started = time.monotonic()
        results = scenario.run(args.out, args.quick)
        results["wall_seconds"] = round(time.monotonic() - started, 1)
        path = write_run(args.out, name, command, {"quick": args.quick}, results)
        headers, rows = scenario.table(results)
        body = [f"### `{name}`", "", scenario.summary, "", f"Command: `{command}` ({results['wall_seconds']} s). "
                f"Raw results: `{path.relative_to(REPO) if path.is_relative_to(REPO) else path}`.", "",
                markdown_table(headers, rows)]
        if scenario.plot is not None:
            png = path.with_suffix(".png")
            scenario.plot(results, png)
            body += ["", f"Plot: `{png.relative_to(REPO) if png.is_relative_to(REPO) else png}`."]
        print("\n".join(body[-3:] if scenario.plot else body[-1:]), flush=True)
        if not args.no_doc:
            replace_section(DOC, f"bench-{name}", "\n".join(body))
        print(f"[bench] {name}: wrote {path}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
