"""The benchmark suite's plumbing only: scenarios parse, tables and the report writer work on fixtures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench  # noqa: E402
import bench_kernels  # noqa: E402
import bench_serving  # noqa: E402
from bench_report import markdown_table, replace_section, write_run  # noqa: E402


@pytest.mark.parametrize("argv,expected", [
    ([], ["overhead", "lora-scaling", "zipf", "baseline-hf", "kernels"]),
    (["zipf", "kernels"], ["zipf", "kernels"]),
])
def test_scenarios_parse(argv, expected):
    args = bench.build_parser().parse_args(argv)
    assert (args.scenarios or list(bench.SCENARIOS)) == expected


def test_unknown_scenario_is_refused():
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["no-such-scenario"])


def test_quick_set_is_marked():
    assert [n for n, s in bench.SCENARIOS.items() if s.in_quick] == ["overhead", "lora-scaling"]


def test_report_writer(tmp_path):
    path = write_run(tmp_path, "demo", "python scripts/bench.py demo", {"quick": True}, {"x": 1.5})
    run = json.loads(path.read_text())
    assert run["results"] == {"x": 1.5} and run["machine"]["cpu_count"] >= 1 and "torch" in run["versions"]
    doc = tmp_path / "bench.md"
    replace_section(doc, "bench-demo", "first")
    replace_section(doc, "bench-other", "other")
    replace_section(doc, "bench-demo", "second")
    text = doc.read_text()
    assert "second" in text and "first" not in text and text.count("bench-demo:start") == 1 and "other" in text


def test_markdown_table():
    assert markdown_table(["a", "b"], [[1, 0.12345]]) == "| a | b |\n|---|---|\n| 1 | 0.123 |"


KERNEL_FIXTURE = {"variants": {
    "no-lora": [{"workload": "base only", "adapters": 0, "rank": None, "output_tokens_per_s": 100.0,
                 "vs_engine_without_lora": 1.0}],
    "stock": [{"workload": "base only", "adapters": 0, "rank": None, "output_tokens_per_s": 50.0,
               "vs_engine_without_lora": 0.5},
              {"workload": "3 adapters r16", "adapters": 3, "rank": 16, "output_tokens_per_s": 10.0,
               "vs_engine_without_lora": 0.1}],
    "grouped": [{"workload": "base only", "adapters": 0, "rank": None, "output_tokens_per_s": 90.0,
                 "vs_engine_without_lora": 0.9},
                {"workload": "3 adapters r16", "adapters": 3, "rank": 16, "output_tokens_per_s": 40.0,
                 "vs_engine_without_lora": 0.4}]}}


def test_scenario_tables_on_fixtures(tmp_path):
    _, rows = bench_kernels.table(KERNEL_FIXTURE)
    assert rows[1] == ["3 adapters r16", "-", 10, 40, 0.1, 0.4, 4.0]
    bench_kernels.plot(KERNEL_FIXTURE, tmp_path / "k.png")
    assert (tmp_path / "k.png").stat().st_size > 0
    _, rows = bench_serving.zipf_table({"split": {"cold": {"count": 3, "ttft_p50_ms": 10.0, "ttft_p99_ms": 20.0}}})
    assert rows == [["cold", 3, 10.0, 20.0]]


@pytest.mark.parametrize("schedule,slots,expected", [
    ([0, 1, 0, 2, 1], 2, [True, True, False, True, True]),
    ([0, 0, 0], 1, [True, False, False]),
    ([0, 1, 2, 0], 3, [True, True, True, False]),
])
def test_cold_flags(schedule, slots, expected):
    assert bench_serving.cold_flags(schedule, slots) == expected


def test_zipf_schedule_is_seeded_and_skewed():
    schedule = bench_serving.zipf_schedule(64, 2000, 1.1)
    assert schedule == bench_serving.zipf_schedule(64, 2000, 1.1)
    assert schedule.count(0) > schedule.count(10) > schedule.count(60)
