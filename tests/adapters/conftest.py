"""Fixtures for the registry tests: the demo base model's spec, adapter copies to mutate."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def base_spec(demo_assets):
    from adapters.base_model import base_model_spec

    return base_model_spec(demo_assets.model_dir)


@pytest.fixture
def copy_adapter(demo_assets, tmp_path) -> Callable[..., Path]:
    """A fresh copy of a demo adapter folder, free to mutate."""

    def copy(source: str = "sql-helper") -> Path:
        target = tmp_path / f"{source}-{uuid.uuid4().hex[:8]}"
        shutil.copytree(demo_assets.adapter_dirs[source], target)
        return target

    return copy


@pytest.fixture(scope="session")
def edit_config() -> Callable[..., None]:
    """Update (or with value None, remove) keys of a folder's adapter_config.json."""

    def edit(folder: Path, **updates) -> None:
        path = folder / "adapter_config.json"
        config = json.loads(path.read_text())
        for key, value in updates.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        path.write_text(json.dumps(config))

    return edit


@pytest.fixture(scope="session")
def rewrite_tensors() -> Callable[[Path, Callable[[dict], dict]], None]:
    """Replace a folder's weights with `mutate(tensors)`, saved as safetensors."""

    def rewrite(folder: Path, mutate: Callable[[dict], dict]) -> None:
        from safetensors.torch import load_file, save_file

        path = folder / "adapter_model.safetensors"
        save_file(mutate(load_file(path)), path)

    return rewrite
