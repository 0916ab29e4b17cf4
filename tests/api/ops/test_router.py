"""Who may read the operator endpoints when tenants are configured."""

from __future__ import annotations

import httpx
import pytest

from api.app import create_app
from api.tenancy.config import parse_tenancy_config
from api.tenancy.keys import hash_key

ADMIN, METRICS, TENANT = "lpx-admin", "lpx-metrics", "lpx-tenant"


@pytest.fixture
async def guarded_client(make_fake_server, fake_engine, tmp_path):
    tenancy = parse_tenancy_config({
        "admin_key_hashes": [hash_key(ADMIN)], "metrics_key_hashes": [hash_key(METRICS)],
        "tenants": [{"name": "acme", "key_hashes": [hash_key(TENANT)], "adapters": ["*"]}],
    })
    server = make_fake_server(tenancy=tenancy)
    transport = httpx.ASGITransport(app=create_app(server))
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(("path", "key", "status"), [
    ("/metrics", None, 401),
    ("/metrics", TENANT, 403),
    ("/metrics", METRICS, 200),
    ("/metrics", ADMIN, 200),
    ("/dashboard/data", METRICS, 403),
    ("/dashboard/data", TENANT, 403),
    ("/dashboard/data", ADMIN, 200),
    ("/dashboard/history", METRICS, 403),
    ("/dashboard/history", ADMIN, 200),
    ("/v1/adapters", METRICS, 403),
    ("/health", None, 200),
    ("/dashboard", None, 200),  # the page itself holds no data
])
async def test_operator_endpoints_need_the_right_key(guarded_client, path, key, status):
    response = await guarded_client.get(path, headers=bearer(key) if key else {})
    assert response.status_code == status, response.text
    if status >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


async def test_a_metrics_key_cannot_generate(guarded_client):
    response = await guarded_client.post("/v1/completions", headers=bearer(METRICS),
                                         json={"model": "fake-base", "prompt": "hi", "max_tokens": 2})
    assert response.status_code == 403 and response.json()["error"]["code"] == "not_a_tenant"


@pytest.mark.parametrize(("query", "param"), [("resolution=5s", "resolution"), ("group=" + "g" * 301, "group")])
async def test_history_query_errors(guarded_client, query, param):
    response = await guarded_client.get(f"/dashboard/history?{query}", headers=bearer(ADMIN))
    assert response.status_code == 400 and response.json()["error"]["param"] == param


@pytest.mark.parametrize(("query", "families"), [
    ("", None),  # everything
    ("?name[]=loraplex_engine_running_requests", {"loraplex_engine_running_requests"}),
    ("?name[]=loraplex_engine_running_requests&name[]=loraplex_requests_in_flight",
     {"loraplex_engine_running_requests", "loraplex_requests_in_flight"}),
    ("?name[]=no_such_metric", set()),
])
async def test_metrics_keep_only_the_named_samples(guarded_client, query, families):
    response = await guarded_client.get(f"/metrics{query}", headers=bearer(METRICS))
    assert response.status_code == 200
    names = {line.split("{")[0].split(" ")[0] for line in response.text.splitlines() if not line.startswith("#")}
    if families is None:
        assert {"loraplex_engine_running_requests", "loraplex_requests_in_flight", "loraplex_batch_running_lines"} < names
    else:
        assert names - {""} == families
