from __future__ import annotations

import httpx
import pytest

from adapters.base_model import base_model_spec
from adapters.registry import Registry, RegistryConfig
from api.app import create_app
from api.config import LoraplexConfig, ServingOptions
from api.server.build import build_server
from api.tenancy.config import TenancyConfig
from api.tenancy.keys import generate_key, hash_key
from engine.config import EngineConfig

VIRTUAL_MODELS = {
    "always-up": {"cascade": {"stages": ["sql-helper", "poet"], "escalate_when": {"output_matches": "."}}},
    "never-up": {"cascade": {"stages": ["sql-helper", "poet"], "escalate_when": {"output_matches": "^$"}}},
    "vote": {"ensemble": {"members": ["poet", "sql-helper", "never-up"]}},
    "sql-pair": {"ensemble": {"members": ["sql-helper", "sql-helper@1"], "aggregate": "max_mean_logprob"}},
}


@pytest.fixture
def graph_registry(demo_assets, tmp_path):
    config = RegistryConfig(store_uri=str(tmp_path / "blobs"), index_url=str(tmp_path / "index.sqlite"))
    registry = Registry.from_config(config, base_model_spec(demo_assets.model_dir), max_lora_rank=64)
    for name in ("poet", "sql-helper"):
        registry.push(demo_assets.adapter_dirs[name], name)
    return registry


@pytest.fixture(scope="session")
def graph_keys() -> dict[str, str]:
    return {"all": generate_key(), "sql": generate_key(), "admin": generate_key()}


def tenancy_data(keys: dict[str, str], virtual_models: dict) -> dict:
    return {
        "admin_key_hashes": [hash_key(keys["admin"])],
        "tenants": [{"name": "all", "key_hashes": [hash_key(keys["all"])], "adapters": ["*"]},
                    {"name": "sql", "key_hashes": [hash_key(keys["sql"])], "adapters": ["sql-*"]}],
        "virtual_models": virtual_models,
    }


def graph_tenancy(keys: dict[str, str], virtual_models: dict) -> TenancyConfig:
    return TenancyConfig.model_validate(tenancy_data(keys, virtual_models))


@pytest.fixture
def graph_server(fake_engine, graph_registry, graph_keys, demo_assets, tmp_path):
    tenants = tmp_path / "tenants.yaml"
    config = LoraplexConfig(engine=EngineConfig(model=str(demo_assets.model_dir)),
                            serving=ServingOptions(ledger_url=str(tmp_path / "usage.sqlite"), config=str(tenants)),
                            tenancy=graph_tenancy(graph_keys, VIRTUAL_MODELS))
    return build_server(fake_engine, graph_registry, config, tiers=None)


@pytest.fixture
async def graph_client(graph_server):
    transport = httpx.ASGITransport(app=create_app(graph_server))
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        yield client
