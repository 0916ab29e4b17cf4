"""A PEFT LoRA adapter in a local folder: identity (name + content hash) and pre-load validation."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLED_WEIGHTS = "adapter_model.bin"
# Files that define what the adapter computes; READMEs and the like don't change its identity.
CONTENT_FILES = (CONFIG_FILE, WEIGHTS_FILE)
SUPPORTED_TARGETS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})


class AdapterValidationError(ValueError):
    """Every problem found with one adapter, reported at once."""

    def __init__(self, name: str, problems: list[str]):
        self.name = name
        self.problems = problems
        super().__init__(f"adapter {name!r}: " + "; ".join(problems))


@dataclass(frozen=True)
class LocalAdapter:
    name: str
    path: Path
    content_hash: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.name}@{self.content_hash[:12]}"


def content_hash(path: Path) -> str:
    """SHA-256 over the names and bytes of the files that define the adapter."""
    digest = hashlib.sha256()
    for file_name in CONTENT_FILES:
        digest.update(file_name.encode() + b"\0")
        with (path / file_name).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


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


def load_local_adapter(name: str, path: Path, max_lora_rank: int) -> LocalAdapter:
    """Validate the folder and return the adapter; raises AdapterValidationError listing every problem."""
    problems = []
    if not NAME_PATTERN.fullmatch(name):
        problems.append(f"name must match {NAME_PATTERN.pattern}")
    if not path.is_dir():
        raise AdapterValidationError(name, problems + [f"{path} is not a directory"])
    if (path / PICKLED_WEIGHTS).exists():
        problems.append(f"{PICKLED_WEIGHTS} (pickle) is not accepted; save with safe_serialization=True")
    if not (path / WEIGHTS_FILE).is_file():
        problems.append(f"missing {WEIGHTS_FILE}")
    config: dict = {}
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except FileNotFoundError:
        problems.append(f"missing {CONFIG_FILE}")
    except (OSError, json.JSONDecodeError) as e:
        problems.append(f"unreadable {CONFIG_FILE}: {e}")
    if not isinstance(config, dict):
        problems.append(f"{CONFIG_FILE} must be a JSON object")
    elif config:
        problems.extend(config_problems(config, max_lora_rank))
    if problems:
        raise AdapterValidationError(name, problems)
    return LocalAdapter(
        name=name,
        path=path.resolve(),
        content_hash=content_hash(path),
        rank=int(config["r"]),
        alpha=float(config.get("lora_alpha", config["r"])),
        target_modules=tuple(sorted(config["target_modules"])),
    )


def parse_adapter_flag(value: str) -> tuple[str, Path]:
    """`NAME=PATH` from the command line."""
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"expected NAME=PATH, got {value!r}")
    return name, Path(path)
