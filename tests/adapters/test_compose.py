"""Mixtures against PEFT's own `add_weighted_adapter(combination_type="cat")` and the formula Σ wᵢ·sᵢ·BᵢAᵢ."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from adapters.compose import Component, CompositionError, compose

WEIGHTS = {"sql-helper": 0.7, "support-bot": -0.3}


def _components(adapter_dirs, weights=WEIGHTS) -> list[Component]:
    return [Component(f"{name}@1", "0" * 64, weight, adapter_dirs[name]) for name, weight in weights.items()]


def _deltas(folder) -> dict[str, torch.Tensor]:
    config = json.loads((folder / "adapter_config.json").read_text())
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    scaling = config["lora_alpha"] / config["r"]
    return {key.rsplit(".lora_A", 1)[0]: tensors[key.replace("lora_A", "lora_B")].double()
            @ tensors[key].double() * scaling for key in tensors if ".lora_A." in key}


@pytest.fixture(scope="module")
def mixture(demo_assets, tmp_path_factory):
    return compose(_components(demo_assets.adapter_dirs), tmp_path_factory.mktemp("mix"))


def test_the_mixture_is_the_weighted_sum_of_its_components(mixture, demo_assets):
    config = json.loads((mixture / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (24, 24)  # 8 + 16, scaling 1
    assert config["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]  # the union
    parts = {name: _deltas(demo_assets.adapter_dirs[name]) for name in WEIGHTS}
    for module, delta in _deltas(mixture).items():
        expected = sum(WEIGHTS[name] * d[module] for name, d in parts.items() if module in d)
        torch.testing.assert_close(delta, expected, rtol=1e-6, atol=1e-7)


def test_the_mixture_equals_peft_cat(mixture, demo_assets):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(demo_assets.model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, demo_assets.adapter_dirs["sql-helper"], adapter_name="sql-helper")
    model.load_adapter(demo_assets.adapter_dirs["support-bot"], adapter_name="support-bot")
    model.add_weighted_adapter(list(WEIGHTS), list(WEIGHTS.values()), "peft-mix", combination_type="cat")
    model.set_adapter("peft-mix")
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        peft_logits = model(ids).logits
        ours = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(demo_assets.model_dir, dtype=torch.float32), mixture)(ids).logits
    # Same math, different summation order (PEFT keeps per-adapter factors): float32 rounding apart.
    torch.testing.assert_close(ours, peft_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("weights,problem", [
    ({"sql-helper": 1.0}, "at least two"),
    ({"sql-helper": float("nan"), "poet": 1.0}, "not a finite number"),
])
def test_refusals(demo_assets, tmp_path, weights, problem):
    with pytest.raises(CompositionError, match=problem):
        compose(_components(demo_assets.adapter_dirs, weights), tmp_path / "mix")
