"""loraplex benchmark suite. Each scenario is a named entry; results go to docs/results/ and docs/benchmarks.md.

    python scripts/bench.py [SCENARIO ...] [--quick]
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

import bench_kernels  # noqa: E402
import bench_serving  # noqa: E402
import bench_tenants  # noqa: E402
import bench_tiers  # noqa: E402
from bench_report import markdown_table, replace_section, write_run  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"


Table = tuple[str, list[str], list[list]]  # caption ("" for none), headers, rows


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    run: Callable[[Path, bool], dict]
    tables: Callable[[dict], list[Table]]
    plot: Callable[[dict, Path], None] | None = None
    in_quick: bool = True  # part of `make bench-quick` (which must finish in under 3 minutes)


def one_table(table: Callable[[dict], tuple[list[str], list[list]]]) -> Callable[[dict], list[Table]]:
    return lambda results: [("", *table(results))]


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("overhead", "loraplex vs vLLM's own OpenAI server, interleaved, same engine and adapters "
                 "(vLLM's serving benchmark as load).", bench_serving.overhead, one_table(bench_serving.overhead_table)),
        Scenario("lora-scaling", "Output tokens/s with 0 (base only), 1, 4 and 16 distinct adapters in the traffic.",
                 bench_serving.lora_scaling, one_table(bench_serving.lora_scaling_table),
                 bench_serving.lora_scaling_plot),
        Scenario("tiers", "Adapter tiers: TTFT and load latency by the tier an adapter is found in; output tokens/s "
                 "with 0, 1, 8 and 64 distinct adapters under Zipf traffic (max_loras 4, max_cpu_loras 16).",
                 bench_tiers.run, bench_tiers.tables, bench_tiers.plot, in_quick=False),
        Scenario("noisy-neighbour", "Tenant A at 5x its fair share beside tenant B: B's TTFT alone and with A, "
                 "with loraplex's fair admission and with first-come-first-served.",
                 bench_tenants.run, bench_tenants.tables, in_quick=False),
        Scenario("baseline-hf", "transformers + peft one request at a time vs loraplex, the same prompts.",
                 bench_serving.baseline_hf, one_table(bench_serving.baseline_hf_table), in_quick=False),
        Scenario("kernels", "Offline throughput: vLLM's stock CPU LoRA ops vs loraplex's grouped ops.",
                 bench_kernels.run, one_table(bench_kernels.table), bench_kernels.plot, in_quick=False),
    )
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", choices=[[], *SCENARIOS], metavar="SCENARIO",
                        help=f"scenarios to run (default: all of {', '.join(SCENARIOS)}; with --quick, those "
                        "marked quick)")
    parser.add_argument("--quick", action="store_true", help="fewer workloads and repeats, quick scenarios only")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results", help="where JSON and PNG files go (default: docs/results)")
    parser.add_argument("--no-doc", action="store_true", help="do not update docs/benchmarks.md")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: print the tables of these saved runs and put them in the doc (after a "
                        "change to how a scenario's tables read)")
    return parser


def _shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def report(scenario: Scenario, command: str, results: dict, path: Path, update_doc: bool) -> None:
    """Prints the run's tables (and draws its plot next to its JSON); updates its section of the doc."""
    body = [f"### `{scenario.name}`", "", scenario.summary, "", f"Command: `{command}` "
            f"({results['wall_seconds']} s). Raw results: `{_shown(path)}`."]
    for caption, headers, rows in scenario.tables(results):
        body += ["", *([f"{caption}:", ""] if caption else []), markdown_table(headers, rows)]
    if scenario.plot is not None:
        png = path.with_suffix(".png")
        scenario.plot(results, png)
        body += ["", f"Plot: `{_shown(png)}`."]
    print("\n".join(body[4:]), flush=True)
    if update_doc:
        replace_section(DOC, f"bench-{scenario.name}", "\n".join(body))


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.report:
        for path in args.report:
            run = json.loads(path.read_text())
            report(SCENARIOS[run["scenario"]], run["command"], run["results"], path, not args.no_doc)
        return
    command = " ".join(["python scripts/bench.py", shlex.join(argv if argv is not None else sys.argv[1:])]).strip()
    default = [n for n, s in SCENARIOS.items() if s.in_quick or not args.quick]
    for name in args.scenarios or default:
        scenario = SCENARIOS[name]
        print(f"[bench] {name}: {scenario.summary}", file=sys.stderr, flush=True)
        started = time.monotonic()
        results = scenario.run(args.out, args.quick)
        results["wall_seconds"] = round(time.monotonic() - started, 1)
        path = write_run(args.out, name, command, {"quick": args.quick}, results)
        report(scenario, command, results, path, not args.no_doc)
        print(f"[bench] {name}: wrote {path}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
