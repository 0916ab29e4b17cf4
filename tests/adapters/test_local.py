from __future__ import annotations

import json
import shutil

import pytest

from adapters.local import AdapterValidationError, content_hash, load_local_adapter, parse_adapter_flag


@pytest.fixture
def adapter_dir(demo_assets, tmp_path):
    target = tmp_path / "a"
    shutil.copytree(demo_assets.adapter_dirs["poet"], target)
    return target


def test_loads_demo_adapter(adapter_dir):
    adapter = load_local_adapter("poet", adapter_dir, max_lora_rank=64)
    assert adapter.rank == 64 and "gate_proj" in adapter.target_modules
    assert len(adapter.content_hash) == 64


def test_hash_changes_with_weights_not_readme(adapter_dir):
    before = content_hash(adapter_dir)
    (adapter_dir / "README.md").write_text("changed")
    assert content_hash(adapter_dir) == before
    weights = adapter_dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
    assert content_hash(adapter_dir) != before


def test_every_problem_reported_at_once(adapter_dir):
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    config.update(peft_type="IA3", r=128, target_modules=["q_proj", "lm_head"])
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config))
    (adapter_dir / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(AdapterValidationError) as info:
        load_local_adapter("Bad Name", adapter_dir, max_lora_rank=64)
    problems = " | ".join(info.value.problems)
    for fragment in ("name must match", "pickle", "peft_type", "exceeds max_lora_rank", "lm_head"):
        assert fragment in problems
    assert len(info.value.problems) == 5


def test_missing_files(tmp_path):
    with pytest.raises(AdapterValidationError) as info:
        load_local_adapter("x", tmp_path, max_lora_rank=64)
    assert any("adapter_model.safetensors" in p for p in info.value.problems)
    assert any("adapter_config.json" in p for p in info.value.problems)


@pytest.mark.parametrize("flag,ok", [("a=/p", True), ("a=", False), ("=/p", False), ("a", False)])
def test_parse_adapter_flag(flag, ok):
    if ok:
        assert parse_adapter_flag(flag)[0] == "a"
    else:
        with pytest.raises(ValueError):
            parse_adapter_flag(flag)
