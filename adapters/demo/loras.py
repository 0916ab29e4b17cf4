"""Deterministic demo LoRA adapters for the tiny model.

PEFT initialises B to zero, which would make every adapter equal to the base model; here A and B are
both drawn from a seeded normal so that each adapter visibly changes greedy outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class DemoAdapterSpec:
    name: str
    rank: int
    alpha: int
    target_modules: tuple[str, ...]
    seed: int
    std: float = 0.3


DEMO_ADAPTERS: tuple[DemoAdapterSpec, ...] = (
    DemoAdapterSpec("sql-helper", rank=8, alpha=16, target_modules=("q_proj", "v_proj"), seed=11),
    DemoAdapterSpec("support-bot", rank=16, alpha=16, target_modules=ATTENTION, seed=22),
    DemoAdapterSpec("poet", rank=64, alpha=32, target_modules=ATTENTION + MLP, seed=33),
)


def build_adapter(base_dir: Path, spec: DemoAdapterSpec, out_dir: Path) -> Path:
    """Write a PEFT LoRA adapter (safetensors) for the model in `base_dir` to `out_dir`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(spec.target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in sorted(peft_model.named_parameters()):
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * spec.std)
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
