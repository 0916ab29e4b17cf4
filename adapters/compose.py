"""A weighted mixture of LoRA adapters as one LoRA adapter, exactly (PEFT's `combination_type="cat"`).

Each component i adds wᵢ·sᵢ·BᵢAᵢ to a module's weight (sᵢ = alphaᵢ/rᵢ, or alphaᵢ/√rᵢ with rsLoRA). Stacking the
A matrices along the rank and the B matrices scaled by wᵢ·sᵢ gives one adapter of rank Σrᵢ whose delta is
Σ wᵢ·sᵢ·BᵢAᵢ, with scaling 1 (alpha = rank). A component that does not adapt a module contributes zero blocks.
The mixture is then validated like any push (its rank against `--max-lora-rank`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from adapters.identity import CONFIG_FILE, WEIGHTS_FILE

METHOD = "cat"
# The config fields a mixture takes from its first component (the rest describe the mixture itself).
KEPT_CONFIG = ("peft_type", "task_type", "base_model_name_or_path", "bias", "fan_in_fan_out", "inference_mode")


class CompositionError(ValueError):
    """The components cannot be mixed (every problem, one per line)."""


@dataclass(frozen=True)
class Component:
    """One adapter of a mixture: its published label and content hash, its weight, and a folder holding it."""

    label: str
    content_hash: str
    weight: float
    path: Path


def _scaling(config: dict) -> float:
    rank, alpha = config["r"], float(config.get("lora_alpha", config["r"]))
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def compose(components: list[Component], out_dir: Path) -> Path:
    """Writes the mixture of `components` to `out_dir` (adapter_config.json and adapter_model.safetensors)."""
    import torch
    from safetensors.torch import load_file, save_file

    if len(components) < 2:
        raise CompositionError("a mixture needs at least two components")
    configs = [json.loads((c.path / CONFIG_FILE).read_text()) for c in components]
    problems = [f"{c.label}: rank_pattern/alpha_pattern (per-module ranks) cannot be mixed"
                for c, cfg in zip(components, configs) if cfg.get("rank_pattern") or cfg.get("alpha_pattern")]
    problems += [f"{c.label}: weight {c.weight} is not a finite number" for c in components
                 if not math.isfinite(c.weight)]
    if problems:
        raise CompositionError("\n".join(problems))
    weights = [load_file(str(c.path / WEIGHTS_FILE)) for c in components]
    total = sum(cfg["r"] for cfg in configs)
    # One entry per adapted module: "…q_proj" -> (A [rank, in], B [out, rank]) of each component that has it.
    modules = sorted({key.rsplit(".lora_", 1)[0] for tensors in weights for key in tensors})
    mixed: dict[str, torch.Tensor] = {}
    for module in modules:
        shapes = next((t[f"{module}.lora_A.weight"].shape[1], t[f"{module}.lora_B.weight"].shape[0])
                      for t in weights if f"{module}.lora_A.weight" in t)
        a = torch.zeros(total, shapes[0], dtype=torch.float32)
        b = torch.zeros(shapes[1], total, dtype=torch.float32)
        start = 0
        for tensors, cfg, component in zip(weights, configs, components):
            rank = cfg["r"]
            if f"{module}.lora_A.weight" in tensors:
                a[start:start + rank] = tensors[f"{module}.lora_A.weight"].float()
                b[:, start:start + rank] = tensors[f"{module}.lora_B.weight"].float() * (
                    component.weight * _scaling(cfg))
            start += rank
        dtype = next(t[f"{module}.lora_A.weight"].dtype for t in weights if f"{module}.lora_A.weight" in t)
        mixed[f"{module}.lora_A.weight"] = a.to(dtype).contiguous()
        mixed[f"{module}.lora_B.weight"] = b.to(dtype).contiguous()
    config = {key: configs[0][key] for key in KEPT_CONFIG if key in configs[0]}
    config.update(r=total, lora_alpha=total, use_rslora=False, lora_dropout=0.0,
                  target_modules=sorted({t for cfg in configs for t in cfg["target_modules"]}))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
    save_file(mixed, str(out_dir / WEIGHTS_FILE))
    return out_dir
