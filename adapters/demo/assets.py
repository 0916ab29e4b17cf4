"""The embedded default: a tiny Llama and demo adapters, generated once under the data directory."""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from adapters.demo.loras import DEMO_ADAPTERS, build_adapter
from adapters.demo.tiny_llama import TinyLlamaSpec, build_tiny_llama

DEMO_VERSION = "demo-v2"


@dataclass(frozen=True)
class DemoAssets:
    model_dir: Path
    adapter_dirs: dict[str, Path]


def _progress(message: str) -> None:
    print(f"[loraplex] {message}", file=sys.stderr, flush=True)


def ensure_demo_assets(home: Path) -> DemoAssets:
    """Build the demo model and adapters unless a complete earlier build is there.

    The build goes to a temporary folder renamed into place at the end, so an interrupted build is
    never mistaken for a finished one.
    """
    root = home / DEMO_VERSION
    assets = DemoAssets(
        model_dir=root / "model",
        adapter_dirs={spec.name: root / "adapters" / spec.name for spec in DEMO_ADAPTERS},
    )
    if (root / "COMPLETE").is_file():
        return assets
    started = time.monotonic()
    staging = home / f".{DEMO_VERSION}.building-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    steps = 1 + len(DEMO_ADAPTERS)
    _progress(f"generating demo assets under {root} (once)")
    _progress(f"[1/{steps}] tiny Llama: training tokenizer, random weights")
    model_dir = build_tiny_llama(staging / "model", TinyLlamaSpec())
    for i, spec in enumerate(DEMO_ADAPTERS, start=2):
        _progress(f"[{i}/{steps}] adapter {spec.name} (rank {spec.rank}, {', '.join(spec.target_modules)})")
        build_adapter(model_dir, spec, staging / "adapters" / spec.name)
    _repoint_base_model(staging, root)
    (staging / "COMPLETE").write_text(DEMO_VERSION + "\n")
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)
    _progress(f"demo assets ready in {time.monotonic() - started:.1f} s")
    return assets


def _repoint_base_model(staging: Path, root: Path) -> None:
    """PEFT records the absolute base path it was built from; point it at the final location."""
    import json

    for config_path in (staging / "adapters").glob("*/adapter_config.json"):
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = str(root / "model")
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
