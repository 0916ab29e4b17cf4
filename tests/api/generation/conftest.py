from __future__ import annotations

import pytest

from adapters.base_model import base_model_spec
from adapters.registry import Registry, RegistryConfig


@pytest.fixture
def registry_with_poet(demo_assets, tmp_path):
    """A registry on a temporary folder holding one version of the demo adapter `poet`."""
    config = RegistryConfig(store_uri=str(tmp_path / "blobs"), index_url=str(tmp_path / "index.sqlite"))
    registry = Registry.from_config(config, base_model_spec(demo_assets.model_dir), max_lora_rank=64)
    registry.push(demo_assets.adapter_dirs["poet"], "poet")
    yield registry
    registry.close()
