from __future__ import annotations

import json
import os

import pytest
import torch

from adapters.base_model import BaseModelError, ModuleShape, base_model_spec, spec_from_config
from adapters.validation import AdapterValidationError, ValidationLimits, validate_adapter_dir

LIMITS = ValidationLimits(max_lora_rank=64, max_bytes=10 * 1024 * 1024)
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


def _renamed(old: str, new: str):
    return lambda tensors: {k.replace(old, new): v for k, v in tensors.items()}


def _replaced(key: str, value):
    return lambda tensors: {**tensors, key: value}


def _without(key: str):
    return lambda tensors: {k: v for k, v in tensors.items() if k != key}


def _llama(**overrides) -> dict:
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
              "num_attention_heads": 4, "num_hidden_layers": 2}
    return {**config, **overrides}


@pytest.mark.parametrize("source,rank,targets", [
    ("sql-helper", 8, ("q_proj", "v_proj")),
    ("support-bot", 16, ("k_proj", "o_proj", "q_proj", "v_proj")),
    ("poet", 64, ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")),
])
def test_demo_adapters_pass(copy_adapter, base_spec, source, rank, targets):
    folder = copy_adapter(source)
    facts = validate_adapter_dir(source, folder, base_spec, LIMITS)
    assert (facts.peft_type, facts.rank, facts.target_modules) == ("LORA", rank, targets)
    assert facts.num_tensors == base_spec.num_hidden_layers * len(targets) * 2
    assert facts.size_bytes == sum((folder / f).stat().st_size
                                   for f in ("adapter_config.json", "adapter_model.safetensors"))


def test_base_model_spec_of_demo_model(base_spec, base_model_id):
    assert base_spec.model_id == base_model_id
    assert base_spec.num_hidden_layers == 4
    # 4 heads of 64, 2 KV heads
    assert base_spec.modules["q_proj"] == ModuleShape(256, 256)
    assert base_spec.modules["k_proj"] == ModuleShape(256, 128)
    assert base_spec.modules["down_proj"] == ModuleShape(512, 256)


@pytest.mark.parametrize("overrides,module,shape", [
    ({}, "v_proj", ModuleShape(256, 256)),
    ({"num_key_value_heads": 1}, "k_proj", ModuleShape(256, 64)),
    ({"head_dim": 32}, "q_proj", ModuleShape(256, 128)),
    ({"head_dim": 32}, "o_proj", ModuleShape(128, 256)),
    ({"head_dim": None, "architectures": ["MistralForCausalLM"]}, "up_proj", ModuleShape(256, 512)),
])
def test_spec_from_config(overrides, module, shape):
    assert spec_from_config("m", _llama(**overrides)).modules[module] == shape


@pytest.mark.parametrize("overrides,fragment", [
    ({"architectures": ["GPT2LMHeadModel"]}, "not Llama-family"),
    ({"architectures": None}, "no architectures"),
    ({"hidden_size": 0}, "hidden_size must be a positive integer"),
    ({"num_key_value_heads": "2"}, "num_key_value_heads must be a positive integer"),
    ({"hidden_size": 250}, "not divisible"),
])
def test_spec_from_config_rejects(overrides, fragment):
    with pytest.raises(BaseModelError, match=fragment):
        spec_from_config("m", _llama(**overrides))


def test_base_model_id_falls_back_to_folder_name(tmp_path):
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_llama()))
    assert base_model_spec(folder).model_id == "my-llama"
    with pytest.raises(BaseModelError, match="no config.json"):
        base_model_spec(tmp_path)


def _mkfifo(folder):
    os.mkfifo(folder / "pipe")


# Each case: how to break a copy of sql-helper (rank 8, q_proj + v_proj, 4 layers), and the problem it must name.
CASES = {
    "bad name": (lambda f, h: {"name": "Bad Name"}, "name 'Bad Name' must match"),
    "pickled weights": (lambda f, h: (f / "adapter_model.bin").write_bytes(b"x"), "pickle"),
    "missing config": (lambda f, h: (f / "adapter_config.json").unlink(), "missing adapter_config.json"),
    "unreadable config": (lambda f, h: (f / "adapter_config.json").write_text("{"), "unreadable adapter_config.json"),
    "config not an object": (lambda f, h: (f / "adapter_config.json").write_text("[]"), "must be a JSON object"),
    "missing weights": (lambda f, h: (f / "adapter_model.safetensors").unlink(), "missing adapter_model.safetensors"),
    "not lora": (lambda f, h: h["edit"](f, peft_type="IA3"), "peft_type must be LORA, got 'IA3'"),
    "rank missing": (lambda f, h: h["edit"](f, r=None), "rank r must be a positive integer, got None"),
    "rank zero": (lambda f, h: h["edit"](f, r=0), "rank r must be a positive integer, got 0"),
    "rank above max": (lambda f, h: {"limits": ValidationLimits(4, LIMITS.max_bytes)},
                       "rank 8 exceeds max_lora_rank 4"),
    "targets empty": (lambda f, h: h["edit"](f, target_modules=[]), "target_modules is empty"),
    "targets regex": (lambda f, h: h["edit"](f, target_modules=".*proj"), "got the pattern '.*proj'"),
    "targets unsupported": (lambda f, h: h["edit"](f, target_modules=["q_proj", "v_proj", "lm_head"]),
                            "unsupported target modules ['lm_head']"),
    "symlink": (lambda f, h: (f / "link").symlink_to("/etc/passwd"), "link is a symlink"),
    "symlinked weights": (lambda f, h: _swap_for_symlink(f / "adapter_model.safetensors"),
                          "adapter_model.safetensors is a symlink"),
    "subdirectory": (lambda f, h: (f / "sub").mkdir(), "sub is a subdirectory"),
    "fifo": (lambda f, h: _mkfifo(f), "pipe is not a regular file"),
    "too big": (lambda f, h: {"limits": ValidationLimits(64, 1000)}, "above the limit of 1000"),
    "header garbage": (lambda f, h: (f / "adapter_model.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"{"),
                       "adapter_model.safetensors: header length 16 runs past"),
    "tensor name": (lambda f, h: h["tensors"](f, _renamed("lora_A.weight", "lora_A.default.weight")),
                    "is not named base_model.model.model.layers.{i}"),
    "layer out of range": (lambda f, h: h["tensors"](f, _renamed("layers.3.", "layers.9.")),
                           "is for layer 9, the base model has 4 layers"),
    "module not declared": (lambda f, h: h["edit"](f, target_modules=["q_proj"]),
                            "tensors target v_proj, which is not in target_modules"),
    "wrong block": (lambda f, h: h["tensors"](f, _renamed("self_attn.q_proj", "mlp.q_proj")),
                    "puts q_proj under mlp, expected self_attn"),
    "wrong shape": (lambda f, h: h["tensors"](f, _replaced(Q_B, torch.zeros(64, 8))),
                    f"tensor {Q_B} has shape [64, 8], expected [256, 8] for rank 8 on base model"),
    "one tensor of another rank": (lambda f, h: h["tensors"](f, _replaced(Q_A, torch.zeros(4, 256))),
                                   f"tensor {Q_A} has shape [4, 256], expected [8, 256]"),
    "rank mismatch": (lambda f, h: h["edit"](f, r=16), "the tensors have rank 8, adapter_config.json says r=16"),
    "integer dtype": (lambda f, h: h["tensors"](f, _replaced(Q_A, torch.zeros(8, 256, dtype=torch.int32))),
                      f"tensor {Q_A} has dtype I32"),
    "declared but absent": (lambda f, h: h["edit"](f, target_modules=["q_proj", "v_proj", "k_proj"]),
                            "target modules ['k_proj'] are declared but have no tensors"),
    "unpaired": (lambda f, h: h["tensors"](f, _without(Q_B)), "layer 0 q_proj has lora_A but no lora_B"),
    "dora": (lambda f, h: h["edit"](f, use_dora=True), "DoRA"),
    "modules_to_save": (lambda f, h: h["edit"](f, modules_to_save=["lm_head"]), "modules_to_save"),
    "alpha": (lambda f, h: h["edit"](f, lora_alpha="big"), "lora_alpha must be a positive number"),
}


def _swap_for_symlink(path):
    target = path.with_name("elsewhere.bin")
    path.rename(target)
    path.symlink_to(target)


@pytest.mark.parametrize("case", list(CASES))
def test_each_problem_is_named(case, copy_adapter, base_spec, edit_config, rewrite_tensors):
    break_it, fragment = CASES[case]
    folder = copy_adapter("sql-helper")
    result = break_it(folder, {"edit": edit_config, "tensors": rewrite_tensors})
    overrides = result if isinstance(result, dict) else {}  # write_bytes returns a count
    with pytest.raises(AdapterValidationError) as info:
        validate_adapter_dir(overrides.get("name", "sql-helper"), folder, base_spec,
                             overrides.get("limits", LIMITS))
    assert any(fragment in p for p in info.value.problems), info.value.problems


def test_not_a_directory(tmp_path, base_spec):
    with pytest.raises(AdapterValidationError, match="not a directory"):
        validate_adapter_dir("x", tmp_path / "absent", base_spec, LIMITS)


def test_several_problems_reported_at_once(copy_adapter, base_spec, edit_config, rewrite_tensors):
    folder = copy_adapter("sql-helper")
    edit_config(folder, peft_type="IA3", target_modules=["q_proj", "v_proj", "k_proj"])
    rewrite_tensors(folder, _replaced(Q_B, torch.zeros(64, 8)))
    (folder / "adapter_model.bin").write_bytes(b"pickle")
    (folder / "sub").mkdir()
    with pytest.raises(AdapterValidationError) as info:
        validate_adapter_dir("Bad/Name", folder, base_spec, LIMITS)
    problems = " | ".join(info.value.problems)
    for fragment in ("name 'Bad/Name'", "sub is a subdirectory", "pickle", "peft_type", "has shape [64, 8]",
                     "['k_proj'] are declared"):
        assert fragment in problems
    assert len(info.value.problems) == 6


@pytest.mark.parametrize("rank,max_bytes", [(0, 1), (64, 0), (True, 1)])
def test_limits_must_be_positive(rank, max_bytes):
    with pytest.raises(ValueError):
        ValidationLimits(max_lora_rank=rank, max_bytes=max_bytes)
