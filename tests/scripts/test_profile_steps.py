"""scripts/profile_steps.py's arithmetic, on fixtures (the profile itself runs engines: a script, not a test)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import profile_steps  # noqa: E402


@pytest.mark.parametrize("seconds,steps,expected", [
    ({"execute_model": 0.002}, 1, {"execute_model": 2000.0}),
    ({"execute_model": 0.5, "_model_forward": 0.25}, 250, {"execute_model": 2000.0, "_model_forward": 1000.0}),
    ({"execute_model": 0.5}, 0, {}),
])
def test_per_step(seconds, steps, expected):
    assert profile_steps.per_step(seconds, steps) == pytest.approx(expected)


def test_summary_takes_medians_and_counts_a_part_the_plain_engine_never_runs_as_zero():
    def run(tok_s, execute, lora=None):
        parts = {"execute_model": execute} | ({"set_active_loras": lora} if lora is not None else {})
        return {"tok_s": tok_s, "steps": 10, "us_per_step": parts}

    rounds = [{"no-lora": run(100.0, 1000.0), "compiled": run(90.0, 1100.0, 40.0)},
              {"no-lora": run(120.0, 900.0), "compiled": run(96.0, 1150.0, 50.0)},
              {"no-lora": run(110.0, 950.0), "compiled": run(99.0, 1050.0, 30.0)}]
    summary = profile_steps.summarize(rounds)
    assert summary["no-lora"]["tok_s"] == 110.0 and summary["compiled"]["tok_s"] == 96.0
    assert summary["extra_us_per_step"] == {"execute_model": 1100.0 - 950.0, "set_active_loras": 40.0}
    assert summary["tok_s_ratio"] == pytest.approx(96.0 / 110.0)
    assert summary["tok_s_ratio_per_round"] == pytest.approx([0.9, 0.8, 0.9])
