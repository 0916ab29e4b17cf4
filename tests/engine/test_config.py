from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from engine.config import EngineConfig
from engine.lora_budget import MAX_AUTO_CPU_LORAS

# A Llama checkpoint's shapes, as config.json gives them: one slot at rank 64 in float32 is 64 * 2 layers *
# (q 512+512, k 512+128, v 512+128, o 512+512, gate 512+1024, up 512+1024, down 1024+512) * 4 bytes = 3.875 MiB.
CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 512, "intermediate_size": 1024,
          "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 2}
SLOT_GIB = 3.875 / 1024
BUDGET = {"lora_slots_gib": 4 * SLOT_GIB, "lora_cpu_gib": 10.5 * SLOT_GIB}


@pytest.fixture
def checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return str(tmp_path)


def test_defaults_are_valid(checkpoint):
    config = EngineConfig(model=checkpoint)
    assert config.dtype == "auto" and 1 <= config.max_loras <= config.max_cpu_loras


@pytest.mark.parametrize("fields,max_loras,max_cpu_loras", [
    (BUDGET, 4, 10),
    ({**BUDGET, "max_lora_rank": 32}, 8, 21),  # half the slot
    ({**BUDGET, "max_loras": 2}, 2, 10),
    ({**BUDGET, "lora_cpu_gib": SLOT_GIB}, 4, 4),  # the CPU cache holds the slots at least
    ({**BUDGET, "max_cpu_loras": 3}, 3, 3),  # slots never outnumber a given CPU cache
    ({"lora_slots_gib": SLOT_GIB / 2}, 1, MAX_AUTO_CPU_LORAS),  # at least one slot; 2 GiB / 3.875 MiB is over the cap
    ({"max_loras": 300}, 300, 300),
    ({"max_loras": 5, "max_cpu_loras": 7}, 5, 7),
])
def test_slot_counts_are_sized_from_the_checkpoint_unless_given(checkpoint, fields, max_loras, max_cpu_loras):
    config = EngineConfig(model=checkpoint, dtype="float32", **fields)
    assert (config.max_loras, config.max_cpu_loras) == (max_loras, max_cpu_loras)


def test_a_sixteen_bit_dtype_fits_twice_the_slots(checkpoint):
    assert EngineConfig(model=checkpoint, dtype="bfloat16", **BUDGET).max_loras == 8
    assert EngineConfig(model=checkpoint, dtype="float32", **BUDGET).max_loras == 4


def test_given_counts_need_no_checkpoint():
    assert EngineConfig(model="/m", max_loras=2, max_cpu_loras=8).max_loras == 2


@pytest.mark.parametrize("fields,fragment", [
    ({"max_lora_rank": 12}, "max_lora_rank must be one of"),
    ({"max_loras": 8, "max_cpu_loras": 4}, "max_cpu_loras (4) must be >= max_loras (8)"),
    ({"kv_cache_gib": 0}, "greater than 0"),
    ({"lora_slots_gib": 0}, "greater than 0"),
    ({"dtype": "int8"}, "dtype"),
    ({"unknown_knob": 1}, "unknown_knob"),
])
def test_invalid_configs(checkpoint, fields, fragment):
    with pytest.raises(ValidationError, match=None) as info:
        EngineConfig(model=checkpoint, **fields)
    assert fragment in str(info.value)


def test_every_problem_reported_at_once():
    with pytest.raises(ValidationError) as info:
        EngineConfig(model="/m", max_lora_rank=12)
    assert "max_lora_rank" in str(info.value) and "sized from the checkpoint: base model: no config.json in /m" in str(
        info.value)
