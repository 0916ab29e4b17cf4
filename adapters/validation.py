"""The one check of a PEFT LoRA folder against a base model, from file metadata only, before any load.

Tensor shapes, dtypes and names come from the safetensors header; no tensor is loaded. Every problem is
reported at once (AdapterValidationError).
"""

from __future__ import annotations

import json
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from adapters.base_model import MODULE_BLOCK, BaseModelSpec
from adapters.identity import CONFIG_FILE, NAME_PATTERN, WEIGHTS_FILE
from adapters.safetensors_header import FLOAT_DTYPES, SafetensorsHeaderError, TensorInfo, read_safetensors_header

PICKLED_WEIGHTS = "adapter_model.bin"
SUPPORTED_TARGETS = frozenset(MODULE_BLOCK)
TENSOR_NAME = re.compile(
    r"^base_model\.model\.model\.layers\.(?P<layer>0|[1-9][0-9]*)\.(?P<block>self_attn|mlp)"
    r"\.(?P<module>[a-z_]+)\.lora_(?P<side>[AB])\.weight$"
)
TENSOR_NAME_FORM = "base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight"


class AdapterValidationError(ValueError):
    """Every problem found with one adapter, reported at once."""

    def __init__(self, name: str, problems: list[str]):
        self.name = name
        self.problems = problems
        super().__init__(f"adapter {name!r}: " + "; ".join(problems))


@dataclass(frozen=True)
class ValidationLimits:
    max_lora_rank: int
    max_bytes: int

    def __post_init__(self) -> None:
        problems = [f"{name} must be a positive integer, got {value!r}"
                    for name, value in (("max_lora_rank", self.max_lora_rank), ("max_bytes", self.max_bytes))
                    if not isinstance(value, int) or isinstance(value, bool) or value < 1]
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class AdapterFacts:
    peft_type: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    size_bytes: int  # config + weights: what is stored and loaded
    num_tensors: int


def validate_adapter_dir(name: str, path: Path, base: BaseModelSpec, limits: ValidationLimits) -> AdapterFacts:
    """The adapter's facts; raises AdapterValidationError listing every problem found."""
    problems: list[str] = []
    if not NAME_PATTERN.fullmatch(name):
        problems.append(f"name {name!r} must match {NAME_PATTERN.pattern}")
    if path.is_symlink() or not path.is_dir():
        raise AdapterValidationError(name, problems + ["the adapter path is not a directory"])
    sizes = _folder_problems(path, limits, problems)
    config = _read_config(path, sizes, problems)
    tensors = _read_tensors(path, sizes, problems)
    if config is not None:
        problems.extend(config_problems(config, limits.max_lora_rank))
        problems.extend(_extra_config_problems(config))
    if config is not None and tensors is not None:
        problems.extend(tensor_problems(tensors, config, base))
    if problems or config is None or tensors is None:
        raise AdapterValidationError(name, problems)
    return AdapterFacts(
        peft_type="LORA",
        rank=config["r"],
        alpha=float(config.get("lora_alpha", config["r"])),
        target_modules=tuple(sorted(config["target_modules"])),
        size_bytes=sizes[CONFIG_FILE] + sizes[WEIGHTS_FILE],
        num_tensors=len(tensors),
    )


def config_problems(config: dict, max_lora_rank: int) -> list[str]:
    """Problems with a parsed adapter_config.json: PEFT type, rank, target modules."""
    problems = []
    if str(config.get("peft_type", "")).upper() != "LORA":
        problems.append(f"peft_type must be LORA, got {config.get('peft_type')!r}")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        problems.append(f"rank r must be a positive integer, got {rank!r}")
    elif rank > max_lora_rank:
        problems.append(f"rank {rank} exceeds max_lora_rank {max_lora_rank}")
    targets = config.get("target_modules") or []
    if isinstance(targets, str):
        problems.append(f"target_modules must be a list of module names, got the pattern {targets!r}")
    elif not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        problems.append(f"target_modules must be a list of module names, got {targets!r}")
    else:
        unsupported = sorted(set(targets) - SUPPORTED_TARGETS)
        if unsupported:
            problems.append(f"unsupported target modules {unsupported}")
        if not targets:
            problems.append("target_modules is empty")
    return problems



def _folder_problems(path: Path, limits: ValidationLimits, problems: list[str]) -> dict[str, int]:
    """Sizes of the regular files in the folder; anything else in it is a problem."""
    sizes: dict[str, int] = {}
    try:
        entries = sorted(path.iterdir())
    except OSError as e:
        problems.append(f"cannot list the adapter folder: {e.strerror or e}")
        return sizes
    for entry in entries:
        mode = entry.lstat().st_mode
        if stat.S_ISLNK(mode):
            problems.append(f"{entry.name} is a symlink (only regular files are accepted)")
        elif stat.S_ISDIR(mode):
            problems.append(f"{entry.name} is a subdirectory (only regular files are accepted)")
        elif not stat.S_ISREG(mode):
            problems.append(f"{entry.name} is not a regular file")
        else:
            sizes[entry.name] = entry.lstat().st_size
    if PICKLED_WEIGHTS in sizes:
        problems.append(f"{PICKLED_WEIGHTS} (pickle) is not accepted; save with safe_serialization=True")
    total = sum(sizes.values())
    if total > limits.max_bytes:
        problems.append(f"the folder holds {total} bytes, above the limit of {limits.max_bytes}")
    return sizes


def _read_config(path: Path, sizes: dict[str, int], problems: list[str]) -> dict | None:
    if CONFIG_FILE not in sizes:
        if not (path / CONFIG_FILE).is_symlink():
            problems.append(f"missing {CONFIG_FILE}")
        return None
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        problems.append(f"unreadable {CONFIG_FILE}: {e}")
        return None
    if not isinstance(config, dict):
        problems.append(f"{CONFIG_FILE} must be a JSON object")
        return None
    return config


def _read_tensors(path: Path, sizes: dict[str, int], problems: list[str]) -> list[TensorInfo] | None:
    if WEIGHTS_FILE not in sizes:
        if not (path / WEIGHTS_FILE).is_symlink():
            problems.append(f"missing {WEIGHTS_FILE}")
        return None
    try:
        return read_safetensors_header(path / WEIGHTS_FILE)
    except SafetensorsHeaderError as e:
        problems.extend(f"{WEIGHTS_FILE}: {p}" for p in e.problems)
        return None


def _extra_config_problems(config: dict) -> list[str]:
    """What vLLM cannot serve although PEFT writes it."""
    problems = []
    alpha = config.get("lora_alpha", 1)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
        problems.append(f"lora_alpha must be a positive number, got {alpha!r}")
    if config.get("use_dora"):
        problems.append("DoRA adapters (use_dora) are not supported")
    if config.get("modules_to_save"):
        problems.append(f"modules_to_save {config['modules_to_save']!r} is not supported")
    return problems


def tensor_problems(tensors: list[TensorInfo], config: dict, base: BaseModelSpec) -> list[str]:
    """Names, dtypes and shapes of the LoRA tensors against the config and the base model.

    A rank or target list that disagrees with every tensor is reported once, not once per tensor.
    """
    problems = []
    declared = config.get("target_modules")
    targets = set(declared) if isinstance(declared, list) and all(isinstance(t, str) for t in declared) else None
    lora: list[tuple[TensorInfo, int, str, str]] = []  # (tensor, layer, module, side)
    for tensor in tensors:
        match = TENSOR_NAME.fullmatch(tensor.name)
        if match is None:
            problems.append(f"tensor {tensor.name} is not named {TENSOR_NAME_FORM}")
            continue
        layer, block, module, side = (int(match["layer"]), match["block"], match["module"], match["side"])
        if layer >= base.num_hidden_layers:
            problems.append(f"tensor {tensor.name} is for layer {layer}, the base model has "
                            f"{base.num_hidden_layers} layers")
        if module not in MODULE_BLOCK:
            problems.append(f"tensor {tensor.name} targets unsupported module {module}")
            continue
        if block != MODULE_BLOCK[module]:
            problems.append(f"tensor {tensor.name} puts {module} under {block}, expected {MODULE_BLOCK[module]}")
        if tensor.dtype not in FLOAT_DTYPES:
            problems.append(f"tensor {tensor.name} has dtype {tensor.dtype}, expected one of {sorted(FLOAT_DTYPES)}")
        lora.append((tensor, layer, module, side))
    rank = _effective_rank(config.get("r"), lora, problems)
    for tensor, _, module, side in lora:
        shape_problem = _shape_problem(tensor, module, side, rank, base)
        if shape_problem:
            problems.append(shape_problem)
    sides: dict[tuple[int, str], set[str]] = {}
    for _, layer, module, side in lora:
        sides.setdefault((layer, module), set()).add(side)
    for (layer, module), present in sorted(sides.items()):
        if present != {"A", "B"}:
            missing = ({"A", "B"} - present).pop()
            problems.append(f"layer {layer} {module} has lora_{present.pop()} but no lora_{missing}")
    if targets is not None:
        present_modules = {module for _, module in sides}
        for module in sorted(present_modules - targets):
            problems.append(f"tensors target {module}, which is not in target_modules")
        absent = sorted(targets & set(MODULE_BLOCK) - present_modules)
        if absent:
            problems.append(f"target modules {absent} are declared but have no tensors")
    return problems


def _effective_rank(declared: object, lora: list[tuple[TensorInfo, int, str, str]], problems: list[str]) -> int | None:
    """The rank to check shapes against: the declared r, or the tensors' own rank when they all disagree with it."""
    valid = declared if isinstance(declared, int) and not isinstance(declared, bool) and declared > 0 else None
    # lora_A: [r, in_features]; lora_B: [out_features, r]
    observed = {t.shape[0] if side == "A" else t.shape[1] for t, _, _, side in lora if len(t.shape) == 2}
    if valid is not None and len(observed) == 1 and valid not in observed:
        (actual,) = observed
        problems.append(f"the tensors have rank {actual}, adapter_config.json says r={valid}")
        return actual
    return valid


def _shape_problem(tensor: TensorInfo, module: str, side: str, rank: int | None, base: BaseModelSpec) -> str | None:
    # lora_A: [r, in_features]; lora_B: [out_features, r]
    shape = base.modules[module]
    shown_rank = rank if rank is not None else "r"
    expected = [shown_rank, shape.in_features] if side == "A" else [shape.out_features, shown_rank]
    actual = list(tensor.shape)
    if len(actual) == 2 and all(e == "r" or e == a for e, a in zip(expected, actual)):
        return None
    expected_text = "[" + ", ".join(str(e) for e in expected) + "]"
    rank_text = f"rank {rank}" if rank is not None else "its rank"
    return (f"tensor {tensor.name} has shape {actual}, expected {expected_text} for {rank_text} on base model "
            f"{base.model_id}")
