"""What an adapter must fit: a Llama-family base model's layer count and projection shapes, from config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

MODEL_MARKER = "loraplex_model.json"
# Same decoder layout and projection names as Llama.
LLAMA_FAMILY = frozenset({"LlamaForCausalLM", "MistralForCausalLM"})
# Which block of a decoder layer holds each projection.
MODULE_BLOCK = {
    "q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
    "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
}


class BaseModelError(ValueError):
    """Every problem with a base model folder, reported at once."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("base model: " + "; ".join(problems))


@dataclass(frozen=True)
class ModuleShape:
    in_features: int
    out_features: int


@dataclass(frozen=True)
class BaseModelSpec:
    model_id: str
    architectures: tuple[str, ...]
    num_hidden_layers: int
    modules: Mapping[str, ModuleShape] = field(hash=False)


def spec_from_config(model_id: str, config: dict) -> BaseModelSpec:
    """Projection shapes of a Llama-family HF config; raises BaseModelError listing every problem."""
    problems = []
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        problems.append("config.json has no architectures list")
        architectures = []
    elif not set(architectures) & LLAMA_FAMILY:
        problems.append(f"architectures {architectures} are not Llama-family (supported: {sorted(LLAMA_FAMILY)})")
    sizes = {}
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers"):
        sizes[key] = config.get(key)
        if not _is_positive(sizes[key]):
            problems.append(f"config.json {key} must be a positive integer, got {sizes[key]!r}")
    for key in ("num_key_value_heads", "head_dim"):
        sizes[key] = config.get(key)
        if sizes[key] is not None and not _is_positive(sizes[key]):
            problems.append(f"config.json {key} must be a positive integer, got {sizes[key]!r}")
    if problems:
        raise BaseModelError(problems)
    hidden, heads = sizes["hidden_size"], sizes["num_attention_heads"]
    kv_heads = sizes["num_key_value_heads"] or heads
    head_dim = sizes["head_dim"]
    if head_dim is None:
        if hidden % heads:
            raise BaseModelError([f"hidden_size {hidden} is not divisible by num_attention_heads {heads}"])
        head_dim = hidden // heads
    intermediate = sizes["intermediate_size"]
    modules = {
        "q_proj": ModuleShape(hidden, heads * head_dim),
        "k_proj": ModuleShape(hidden, kv_heads * head_dim),
        "v_proj": ModuleShape(hidden, kv_heads * head_dim),
        "o_proj": ModuleShape(heads * head_dim, hidden),
        "gate_proj": ModuleShape(hidden, intermediate),
        "up_proj": ModuleShape(hidden, intermediate),
        "down_proj": ModuleShape(intermediate, hidden),
    }
    return BaseModelSpec(model_id=model_id, architectures=tuple(architectures),
                         num_hidden_layers=sizes["num_hidden_layers"], modules=modules)


def base_model_spec(model_dir: Path) -> BaseModelSpec:
    """The spec of the checkpoint in `model_dir`. Its id comes from `loraplex_model.json`, else the folder name."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except FileNotFoundError as e:
        raise BaseModelError([f"no config.json in {model_dir}"]) from e
    except (OSError, json.JSONDecodeError) as e:
        raise BaseModelError([f"unreadable config.json in {model_dir}: {e}"]) from e
    if not isinstance(config, dict):
        raise BaseModelError([f"config.json in {model_dir} is not a JSON object"])
    model_id = model_dir.resolve().name
    marker = model_dir / MODEL_MARKER
    if marker.exists():
        try:
            model_id = json.loads(marker.read_text())["model_id"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise BaseModelError([f"unreadable {MODEL_MARKER} in {model_dir}: {e!r}"]) from e
        if not isinstance(model_id, str) or not model_id:
            raise BaseModelError([f"{MODEL_MARKER} model_id must be a non-empty string, got {model_id!r}"])
    return spec_from_config(model_id, config)


def _is_positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
