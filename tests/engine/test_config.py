from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.config import EngineConfig


def test_defaults_are_valid():
    config = EngineConfig(model="/m")
    assert config.dtype == "auto" and config.max_loras <= config.max_cpu_loras


@pytest.mark.parametrize("fields,fragment", [
    ({"max_lora_rank": 12}, "max_lora_rank must be one of"),
    ({"max_loras": 8, "max_cpu_loras": 4}, "max_cpu_loras (4) must be >= max_loras (8)"),
    ({"kv_cache_gib": 0}, "greater than 0"),
    ({"dtype": "int8"}, "dtype"),
    ({"unknown_knob": 1}, "unknown_knob"),
])
def test_invalid_configs(fields, fragment):
    with pytest.raises(ValidationError, match=None) as info:
        EngineConfig(model="/m", **fields)
    assert fragment in str(info.value)


def test_every_problem_reported_at_once():
    with pytest.raises(ValidationError) as info:
        EngineConfig(model="/m", max_lora_rank=12, max_loras=8, max_cpu_loras=4)
    assert "max_lora_rank" in str(info.value) and "max_cpu_loras" in str(info.value)
