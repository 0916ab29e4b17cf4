"""The benchmark suite's plumbing only: scenarios parse, tables and the report writer work on fixtures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench  # noqa: E402
import bench_admission  # noqa: E402
import bench_batch  # noqa: E402
import bench_cluster  # noqa: E402
import bench_defaults  # noqa: E402
import bench_kernels  # noqa: E402
import bench_scale  # noqa: E402
import bench_servers  # noqa: E402
import bench_serving  # noqa: E402
import bench_state  # noqa: E402
import bench_tenants  # noqa: E402
import bench_tiers  # noqa: E402
from bench_report import markdown_table, replace_section, write_run  # noqa: E402


@pytest.mark.parametrize("argv,expected", [
    ([], ["overhead", "lora-scaling", "tiers", "noisy-neighbour", "baseline-hf", "batch", "cluster", "kernels",
          "mixed", "state", "routing", "scale", "structured", "admission", "defaults", "grpc", "mixture"]),
    (["tiers", "kernels"], ["tiers", "kernels"]),
])
def test_scenarios_parse(argv, expected):
    args = bench.build_parser().parse_args(argv)
    assert (args.scenarios or list(bench.SCENARIOS)) == expected


def test_unknown_scenario_is_refused():
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["no-such-scenario"])


def test_scenarios_on_smollm2():
    assert [n for n, s in bench.SCENARIOS.items() if "smollm2" in s.models] == ["overhead", "lora-scaling",
                                                                               "baseline-hf", "mixed"]
    assert bench.build_parser().parse_args(["--model", "smollm2", "overhead"]).model == "smollm2"
    assert bench.build_parser().parse_args([]).model == "tiny"


def test_a_tiny_only_scenario_on_smollm2_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(bench, "bench_model", lambda name: pytest.fail("nothing should be built"))
    with pytest.raises(SystemExit):
        bench.main(["--model", "smollm2", "tiers"])
    assert "tiers do(es) not run on it" in capsys.readouterr().err


def test_a_smollm2_run_has_a_section_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "DOC", tmp_path / "bench.md")
    results = {"model": "smollm2-135m-instruct", "wall_seconds": 1.0, "prompts": 8, "max_tokens": 32,
               "models": [], "hf_tok_s": 10.0, "loraplex_tok_s": 50.0, "ratio": 5.0}
    for model in ("smollm2-135m-instruct", "loraplex/tiny-llama"):
        path = write_run(tmp_path, "baseline-hf", "cmd", {}, {**results, "model": model})
        bench.report(bench.SCENARIOS["baseline-hf"], "cmd", {**results, "model": model}, path, True)
    doc = (tmp_path / "bench.md").read_text()
    assert "<!-- bench-baseline-hf-smollm2:start -->" in doc and "<!-- bench-baseline-hf:start -->" in doc
    assert "### `baseline-hf` on `smollm2-135m-instruct`" in doc


def test_bfloat16_runs_only_the_server_scenarios_and_gets_sections_of_its_own(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "bench_model", lambda name: pytest.fail("nothing should be built"))
    with pytest.raises(SystemExit):
        bench.main(["--dtype", "bfloat16", "kernels"])
    assert "kernels do(es) not run in it" in capsys.readouterr().err
    monkeypatch.setattr(bench, "DOC", tmp_path / "bench.md")
    results = {"model": "smollm2-135m-instruct", "wall_seconds": 1.0, "adapters": [], "results": []}
    scenario = bench.SCENARIOS["lora-scaling"]
    for dtype in ("float32", "bfloat16"):
        run = {**results, "dtype": dtype}
        bench.report(scenario, "cmd", run, write_run(tmp_path, "lora-scaling", "cmd", {}, run), True)
    doc = (tmp_path / "bench.md").read_text()
    assert "<!-- bench-lora-scaling-smollm2:start -->" in doc
    assert "<!-- bench-lora-scaling-smollm2-bf16:start -->" in doc
    assert "### `lora-scaling` on `smollm2-135m-instruct` in bfloat16" in doc


def test_quick_set_is_marked():
    assert [n for n, s in bench.SCENARIOS.items() if s.in_quick] == ["overhead", "lora-scaling"]


def test_report_renders_a_saved_run(tmp_path, monkeypatch, capsys):
    path = write_run(tmp_path, "tiers", "python scripts/bench.py tiers", {"quick": False},
                     {**TIERS_FIXTURE, "wall_seconds": 1.0})
    monkeypatch.setattr(bench, "DOC", tmp_path / "bench.md")
    bench.main(["--report", str(path)])
    doc = (tmp_path / "bench.md").read_text()
    assert "<!-- bench-tiers:start -->" in doc and "| engine | 2 | 41 | 151 | 0 |" in doc
    assert path.with_suffix(".png").exists() and "store fetches" in capsys.readouterr().out


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
    "eager": [{"workload": "base only", "adapters": 0, "rank": None, "output_tokens_per_s": 90.0,
               "vs_engine_without_lora": 0.9},
              {"workload": "3 adapters r16", "adapters": 3, "rank": 16, "output_tokens_per_s": 40.0,
               "vs_engine_without_lora": 0.4}],
    "native": [{"workload": "base only", "adapters": 0, "rank": None, "output_tokens_per_s": 95.0,
                "vs_engine_without_lora": 0.95},
               {"workload": "3 adapters r16", "adapters": 3, "rank": 16, "output_tokens_per_s": 80.0,
                "vs_engine_without_lora": 0.8}]}}

MIXED_FIXTURE = {"summary": [{"kernel": "native", "base_tok_s": 100.0, "mixed_tok_s": 90.0,
                              "ratio_per_round": [0.88, 0.92], "base_ttft_p99_ms": 50.0, "mixed_ttft_p99_ms": 60.4}]}


def test_scenario_tables_on_fixtures(tmp_path):
    headers, rows = bench_kernels.table(KERNEL_FIXTURE)
    assert headers[-1] == "native / eager"
    assert rows[1] == ["3 adapters r16", "-", 10, 40, 80, 0.1, 0.4, 0.8, 2.0]
    assert bench_serving.mixed_table(MIXED_FIXTURE)[1] == [["native", 100, 90, 0.9, "0.880, 0.920", 50, 60]]
    with_reference = {"no_lora_tok_s": [110.0, 100.0], "summary": [
        {**MIXED_FIXTURE["summary"][0], "base_vs_no_lora_per_round": [0.91, 1.0],
         "mixed_vs_no_lora_per_round": [0.8, 0.9]}]}
    headers, rows = bench_serving.mixed_table(with_reference)
    assert headers[-2:] == ["base / no-lora per round", "mixed / no-lora per round"]
    assert rows[0][-2:] == ["0.91, 1.00", "0.80, 0.90"]
    with_stock = {**with_reference, "stock_lora_mixed_tok_s": [10.0, 9.0], "summary": [
        {**with_reference["summary"][0], "mixed_vs_stock_lora_per_round": [8.04, 10.0]}]}
    headers, rows = bench_serving.mixed_table(with_stock)
    assert headers[-3:] == ["base / no-lora per round", "mixed / no-lora per round",
                            "mixed / vLLM stock LoRA per round"]
    assert rows[0][-1] == "8.0, 10.0"
    bench_kernels.plot(KERNEL_FIXTURE, tmp_path / "k.png")
    assert (tmp_path / "k.png").stat().st_size > 0


BATCH_FIXTURE = {
    "live_rate_per_s": 2.0, "live_tokens": 32, "rounds": 2,
    "ttft": {"alone": {"requests": 32, "ttft_p50_ms": 20.0, "ttft_p95_ms": 40.0, "ttft_p99_ms": 50.0},
             "with_batch": {"requests": 32, "ttft_p50_ms": 22.0, "ttft_p95_ms": 44.0, "ttft_p99_ms": None},
             "p95_with_vs_alone": 1.1, "batch_lines_done_during_live": 7, "batch_preemptions_during_live": 30.0},
    "throughput": {"prompts": 64, "output_tokens_each": 64, "live_tok_s": [900.0, 1100.0], "batch_tok_s": [950.0],
                   "live_tok_s_mean": 1000.0, "batch_tok_s_mean": 950.0, "batch_vs_live": 0.95},
}


def test_batch_tables_on_fixture():
    (caption, _, ttft), (tp_caption, _, tp) = bench_batch.tables(BATCH_FIXTURE)
    assert "1.10" in caption and "preempted: 30" in caption
    assert ttft == [["live alone", 32, 20, 40, 50], ["live beside a running batch", 32, 22, 44, "-"]]
    assert "0.95" in tp_caption and tp[0][1:] == [1000, "900, 1100"]


def test_zipf_schedule_is_seeded_and_skewed():
    schedule = bench_tiers.zipf_schedule(64, 2000, 1.1)
    assert schedule == bench_tiers.zipf_schedule(64, 2000, 1.1)
    assert schedule.count(0) > schedule.count(10) > schedule.count(60)


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([0.1, 0.2, 0.3], 50, 200.0),
    ([0.0, 1.0], 99, 990.0),
    ([0.5], 50, None),
    ([], 99, None),
])
def test_percentile_ms(values, q, expected):
    assert bench_servers.percentile_ms(values, q) == pytest.approx(expected)


@pytest.mark.parametrize(("values", "limit", "expected"), [
    ([0.1, 0.5, 0.9], 0.5, 2 / 3),
    ([1.0], 0.5, 0.0),
    ([], 0.5, None),
])
def test_within(values, limit, expected):
    assert bench_tenants.within(values, limit) == pytest.approx(expected)


METRICS_PAGE = """\
# HELP loraplex_adapter_cache_hits_total Adapter found in a tier.
# TYPE loraplex_adapter_cache_hits_total counter
loraplex_adapter_cache_hits_total{adapter="x@1",tier="engine"} 3.0
loraplex_adapter_cache_hits_total{adapter="y@1",tier="engine"} 2.0
loraplex_adapter_cache_hits_total{adapter="y@1",tier="cpu"} 1.0
# HELP loraplex_adapter_cache_misses_total Adapter not found in a tier.
# TYPE loraplex_adapter_cache_misses_total counter
loraplex_adapter_cache_misses_total{adapter="x@1",tier="disk"} 1.0
# HELP loraplex_adapter_load_seconds Time to bring an adapter into a tier.
# TYPE loraplex_adapter_load_seconds histogram
loraplex_adapter_load_seconds_bucket{le="+Inf",tier="cpu"} 2.0
loraplex_adapter_load_seconds_count{tier="cpu"} 2.0
loraplex_adapter_load_seconds_sum{tier="cpu"} 0.04
"""


def test_tier_counts_and_delta():
    counts = bench_tiers.tier_counts(METRICS_PAGE)
    assert counts == {"engine": {"hits": 5.0}, "cpu": {"hits": 1.0, "loads": 2.0, "load_seconds": 0.04},
                      "disk": {"misses": 1.0}}
    before = {"engine": {"hits": 4.0}}
    assert bench_tiers.counts_delta(counts, before)["engine"] == {"hits": 1.0}
    assert bench_tiers.counts_delta(counts, before)["disk"] == {"misses": 1.0}


@pytest.mark.parametrize(("delta", "tier"), [
    ({"engine": {"hits": 1.0}, "cpu": {"hits": 0.0}}, "engine"),
    ({"engine": {"misses": 1.0}, "cpu": {"hits": 1.0}}, "cpu"),
    ({"engine": {"misses": 1.0}, "cpu": {"misses": 1.0}, "disk": {"hits": 1.0}}, "disk"),
    ({"engine": {"misses": 1.0}, "cpu": {"misses": 1.0}, "disk": {"misses": 1.0, "loads": 1.0}}, "store"),
    ({}, None),
])
def test_found_in(delta, tier):
    assert bench_tiers.found_in(delta) == tier


TIERS_FIXTURE = {
    "zipf_s": 1.1, "concurrency": 8, "max_tokens": 32, "max_loras": 4, "max_cpu_loras": 16, "rank": 8,
    "ttft_by_tier": {t: {"count": 2, "ttft_p50_ms": 40.0 + i, "ttft_p99_ms": 150.0 + i, "not_as_expected": 0}
                     for i, t in enumerate(bench_tiers.PROBE_TIERS)},
    "load_by_tier": {"store": {"count": 2, "p50_ms": 20.0, "p99_ms": 21.0},
                     "disk": {"count": 2, "p50_ms": 16.0, "p99_ms": None}},
    "zipf": [{"distinct_adapters": 0, "distinct_used": 1, "output_tok_s": 300.4, "ttft_p50_ms": 80.0,
              "ttft_p99_ms": 160.0, "tiers": {}},
             {"distinct_adapters": 8, "distinct_used": 7, "output_tok_s": 150.6, "ttft_p50_ms": 170.0,
              "ttft_p99_ms": 1100.3, "tiers": {"engine": {"hits": 20.0},
                                               "cpu": {"hits": 5.0, "loads": 4.0, "load_seconds": 0.1},
                                               "disk": {"hits": 1.0, "misses": 7.0}}}],
}


def test_tiers_tables_on_fixture(tmp_path):
    ttft, loads, zipf = bench_tiers.tables(TIERS_FIXTURE)
    assert [row[0] for row in ttft[2]] == ["engine", "cpu", "disk", "store"]
    assert ttft[2][0] == ["engine", 2, 41.0, 151, 0]
    assert loads[2] == [["disk", 2, 16.0, "-"], ["store", 2, 20.0, 21.0]]
    assert zipf[2] == [["0 (base only)", 1, 300, 80.0, 160, 0, 0, 0, 0, 0, "-"],
                       [8, 7, 151, 170, 1100, 20, 5, 1, 7, 4, 25.0]]
    bench_tiers.plot(TIERS_FIXTURE, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0


def _phase(p99: float) -> dict:
    return {"b_ttft_p50_ms": p99 / 2, "b_ttft_p95_ms": p99 * 0.9, "b_ttft_p99_ms": p99, "b_e2e_p99_ms": p99 * 3,
            "b_within_ttft_objective": 0.5, "b_tok_s": 100.0, "a_tok_s": 0.0}


def test_noisy_neighbour_table_on_fixture():
    results = {"ttft_objective_s": 0.5, "b_concurrency": 4, "a_concurrency": 20, "modes": {
        "fair": {"b_alone": _phase(100.0), "b_with_a": {**_phase(250.0), "b_ttft_p99_vs_alone": 2.5}}}}
    [(_, headers, rows)] = bench_tenants.tables(results)
    assert headers[6] == "B TTFT <= 500 ms"
    assert rows == [["fair", "B alone", 50, 90, 100, 300, "50%", 100, 0, 1.0],
                    ["fair", "B + A", 125, 225, 250, 750, "50%", 100, 0, 2.5]]


def test_tenants_config_is_valid():
    from api.tenancy.config import TenancyConfig

    for admission in bench_tenants.MODES.values():
        config = TenancyConfig.model_validate(bench_tenants.tenants_config({"a": "ka", "b": "kb"}, admission))
        assert [t.name for t in config.tenants] == ["a", "b"]


def test_state_tables():
    timing = {"p50_ms": 0.1, "p99_ms": 0.3, "mean_ms": 0.12, "n": 3}
    results = {"requests": 3, "commits": 2,
               "admission": {"memory": {"admit": timing, "settle": timing, "admit_settle": timing}},
               "ledger": {"postgresql": timing}}
    (_, _, admission), (_, headers, ledger) = bench_state.tables(results)
    assert admission == [["memory", 0.1, 0.3, 0.1, 0.3, 0.1, 0.3]]
    assert headers == ["ledger", "p50", "p99", "mean"] and ledger == [["postgresql", 0.1, 0.3, 0.12]]


def test_cluster_tables_show_the_hop_against_the_single_process_server():
    def setup(name, ttft, tpot):
        return {"setup": name, "ready_s": 30.0,
                "zipf": {"distinct_used": 20, "cold_loads": 30.0, "ttft_p50_ms": 50.0, "ttft_p99_ms": 400.0,
                         "output_tok_s": 900.0},
                "hop": {"ttft_p50_ms": ttft, "tpot_p50_ms": tpot}}

    results = {"num_adapters": 64, "zipf_s": 1.1, "concurrency": 8, "max_tokens": 32, "max_loras": 4,
               "max_cpu_loras": 8, "setups": [setup("single process", 10.0, 5.0), setup("2 replicas", 14.5, 5.25)]}
    (_, _, zipf), (_, headers, hop), _ = bench_cluster.tables(results)
    assert zipf[0] == ["single process", 20, 30, 50.0, 400.0, 900]
    assert hop[1] == ["2 replicas", 14.5, 4.5, 5.25, 0.25, 30.0]


def test_overhead_table_lists_every_rounds_ratio():
    summary = {"concurrency": 8, "loraplex_tok_s": 990.4, "vllm_tok_s": 1000.0, "throughput_ratio": 0.9904,
               "round_ratios": [0.95, 1.02, 1.0], **{f"{m}_{p}_diff_ms": 1.25 for m in ("ttft", "tpot")
                                                     for p in ("median", "p99")},
               "loraplex_api_cpu_ms_per_token": 0.5, "vllm_api_cpu_ms_per_token": 0.25}
    headers, [row] = bench_serving.overhead_table({"summary": [summary]})
    assert headers[4] == "ratio per round" and row[:5] == [8, 990, 1000, 0.99, "0.95 / 1.02 / 1.00"]
    assert row[9] == "0.50 / 0.25"


def test_scale_tables():
    load = {"requests": 192, "distinct_used": 61, "output_tok_s": 812.4, "ttft_p50_ms": 90.04, "ttft_p99_ms": 700.0}
    results = {"registered": 1000, "listed_models": 1001, "ready_s": 95.2, "concurrency": 8, "max_tokens": 32,
               "max_loras": 4, "zipf_vs_one_adapter": 0.4, "loads": {"Zipf over 100 of 1000": load},
               "exact_sample": {"scale1k-001": True, "scale1k-002": False}}
    (caption, _, rows), (_, _, exact) = bench_scale.tables(results)
    assert "Zipf / one adapter: 0.40" in caption and rows == [["Zipf over 100 of 1000", 192, 61, 812, 90.0, 700.0]]
    assert exact == [["scale1k-001", "yes"], ["scale1k-002", "NO"]]


def test_admission_tables_and_summary():
    runs = [{"output_tok_s": tok_s, "ttft_p50_ms": 10.0, "ttft_p99_ms": p99, "engine_loads": 3.0}
            for tok_s, p99 in ((900.0, 40.0), (1100.0, 60.0), (1000.0, 50.0))]
    summary = bench_admission.summarize(runs)
    assert summary["output_tok_s"] == 1000.0 and summary["output_tok_s_range"] == [900.0, 1100.0]
    assert summary["ttft_p99_ms"] == 50.0
    results = {"adapters": 64, "rank": 8, "max_loras": 4, "max_running": 16, "max_tokens": 32, "requests": 192,
               "rounds": 3, "distinct_in_schedule": 45,
               "summary": {"aware": {"Zipf, c=32": summary}, "plain": {"Zipf, c=32": summary}},
               "aware_vs_plain_tok_s_by_round": {"Zipf, c=32": [1.1, 0.9, 1.0]},
               "goals": {"aware": {"zipf_c8_vs_one_adapter_tok_s": 0.55, "zipf_c8_ttft_p99_vs_base": 7.04}}}
    (caption, _, rows), (_, _, goals) = bench_admission.tables(results)
    assert "3 interleaved rounds" in caption
    assert rows == [["Zipf, c=32", "aware", 1000, "900-1100", 10, 50, 3, "1.10 0.90 1.00"],
                    ["Zipf, c=32", "plain", 1000, "900-1100", 10, 50, 3, ""]]
    assert goals == [["aware", "0.55", "7.0"]]


def test_defaults_tables_name_each_servers_slots_and_goals():
    summary = {"output_tok_s": 1000.0, "output_tok_s_range": [900.0, 1100.0], "ttft_p50_ms": 10.0,
               "ttft_p99_ms": 50.0, "engine_loads": 0.0}
    results = {"adapters": 64, "rank": 8, "concurrency": 8, "max_tokens": 32, "requests": 192, "rounds": 3,
               "distinct_in_schedule": 45,
               "servers": {"defaults": {"max_loras": 16, "max_cpu_loras": 256},
                           "4 slots": {"max_loras": 4, "max_cpu_loras": 8}},
               "summary": {"defaults": {"Zipf": summary}, "4 slots": {"Zipf": {**summary, "engine_loads": 70.0}}},
               "goals": {"defaults": {"zipf_vs_one_adapter_tok_s": 0.91, "zipf_ttft_p99_vs_base": 1.43},
                         "4 slots": {"zipf_vs_one_adapter_tok_s": 0.64, "zipf_ttft_p99_vs_base": 7.04}}}
    (caption, _, rows), (_, _, goals) = bench_defaults.tables(results)
    assert "defaults: max_loras 16, max_cpu_loras 256; 4 slots: max_loras 4, max_cpu_loras 8" in caption
    assert rows == [["Zipf", "defaults", 1000, "900-1100", 10, 50, 0],
                    ["Zipf", "4 slots", 1000, "900-1100", 10, 50, 70]]
    assert goals == [["defaults", "0.91", "1.4"], ["4 slots", "0.64", "7.0"]]


def test_batch_tables_show_the_phases_without_their_first_request():
    t = dict(BATCH_FIXTURE["ttft"])
    t["alone_after_first"] = {"requests": 30, "ttft_p50_ms": 20.0, "ttft_p95_ms": 39.0, "ttft_p99_ms": 45.0}
    t["with_batch_after_first"] = {"requests": 30, "ttft_p50_ms": 21.0, "ttft_p95_ms": 40.0, "ttft_p99_ms": 46.0}
    (_, _, ttft), _ = bench_batch.tables({**BATCH_FIXTURE, "ttft": t})
    assert [row[0] for row in ttft[2:]] == ["live alone, each phase's first request left out",
                                             "beside a batch, the request that preempts it left out"]
    assert ttft[3][1:] == [30, 21, 40, 46]


def test_structured_spreads_json_requests_over_every_model():
    import bench_structured

    models = ["base", "a", "b", "c"]
    bodies = [bench_structured._body(models, i, with_json=True) for i in range(32)]
    constrained = [b for b in bodies if "response_format" in b]
    assert len(constrained) == 32 // bench_structured.JSON_SHARE
    assert {b["model"] for b in constrained} == set(models)
    assert all("response_format" not in b for b in (bench_structured._body(models, i, False) for i in range(8)))
