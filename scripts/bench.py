"""loraplex benchmark suite. Each scenario is a named entry; results go to bench-results/ and docs/benchmarks.md.

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


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("kernels", "Offline throughput: vLLM's stock CPU LoRA ops vs loraplex's grouped ops.",
                 bench_kernels.run, bench_kernels.table, bench_kernels.plot),
    )
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS), choices=[[], *SCENARIOS],
                        metavar="SCENARIO", help=f"scenarios to run (default: all of {', '.join(SCENARIOS)})")
    parser.add_argument("--quick", action="store_true", help="fewer workloads and repeats")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results", help="where JSON and PNG files go (default: docs/results)")
    parser.add_argument("--no-doc", action="store_true", help=f"do not update {DOC.relative_to(REPO)}")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    command = "python scripts/bench.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    for name in args.scenarios or list(SCENARIOS):
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
