"""Two servers configured as replicas (limits in a real Redis, ledger and registry index in a real PostgreSQL)
behave as one: a tenant's limit holds across both, each sees the other's usage rows and adapters."""

from __future__ import annotations

import httpx
import redis

from adapters.base_model import base_model_spec
from adapters.registry import Registry, RegistryConfig
from api.app import create_app
from api.config import LoraplexConfig, ServingOptions
from api.server import running
from api.server.build import build_server
from api.tenancy.config import parse_tenancy_config
from api.tenancy.keys import hash_key
from api.tenancy.limits_redis import RedisLimits
from engine.config import EngineConfig

KEY = "lpx-shared"
BODY = {"model": "fake-base", "prompt": "x", "max_tokens": 4}


async def test_two_replicas_share_limits_usage_and_adapters(fake_engine, demo_assets, redis_server, postgres_server,
                                                            tmp_path):
    limits_url = redis_server.url.rsplit("/", 1)[0] + "/1"
    redis.Redis.from_url(limits_url).flushdb()
    dsn = postgres_server.new_database()
    tenancy = parse_tenancy_config({"tenants": [{"name": "solo", "key_hashes": [hash_key(KEY)], "adapters": ["*"],
                                                 "limits": {"requests_per_minute": 3}}]})
    registry = RegistryConfig(store_uri=str(tmp_path / "blobs"), index_url=dsn)
    config = LoraplexConfig(engine=EngineConfig(model=str(demo_assets.model_dir)), registry=registry, tenancy=tenancy,
                            serving=ServingOptions(limits_url=limits_url, ledger_url=dsn))
    base = base_model_spec(demo_assets.model_dir)
    replicas = [build_server(fake_engine, Registry.from_config(registry, base, max_lora_rank=64), config, tiers=None)
                for _ in range(2)]
    headers = {"Authorization": f"Bearer {KEY}"}
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(s)), base_url="http://fake",
                                 headers=headers) for s in replicas]
    try:
        statuses = [(await clients[i % 2].post("/v1/completions", json=BODY)).status_code for i in range(3)]
        refused = await clients[1].post("/v1/completions", json=BODY)
        assert statuses == [200, 200, 200]
        assert refused.status_code == 429 and "requests_per_minute" in refused.json()["error"]["message"]
        assert refused.headers["x-ratelimit-remaining-requests"] == "0" and refused.headers["retry-after"]

        for client in clients:
            usage = (await client.get("/v1/usage")).json()
            assert sorted(row["status"] for row in usage["data"]) == [200, 200, 200, 429]  # refusals are billed rows

        replicas[0].registry.push_with_status(demo_assets.adapter_dirs["sql-helper"], "shared-adapter")
        models = (await clients[1].get("/v1/models")).json()["data"]
        assert "shared-adapter" in {m["id"] for m in models}
    finally:
        for client in clients:
            await client.aclose()
        for server in replicas:
            running.close(server)
    # Settlements run off the event loop; closing waits for them, so no slot is left held.
    observer = RedisLimits(limits_url, {"solo": tenancy.tenant("solo").limits})
    try:
        assert observer.running("solo") == 0
        assert observer.headers("solo")["x-ratelimit-remaining-requests"] == "0"
    finally:
        observer.close()
