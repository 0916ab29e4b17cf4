"""The admin API documents its responses in the server's OpenAPI schema, and answers with them."""

from __future__ import annotations

import pytest


async def test_openapi_documents_admin_responses(fake_client):
    schema = (await fake_client.get("/openapi.json")).json()
    components = schema["components"]["schemas"]
    for name in ("AdapterList", "AdapterView", "VersionView", "AliasView", "DeletedVersion", "LoadResult",
                 "EvictResult", "PromoteRequest"):
        assert name in components, name
    listing = schema["paths"]["/v1/adapters"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert listing == {"$ref": "#/components/schemas/AdapterList"}
    assert "resident" in components["VersionView"]["properties"]


async def test_empty_registry_lists_nothing(fake_client):
    response = await fake_client.get("/v1/adapters")
    assert response.status_code == 200 and response.json() == {"object": "list", "data": []}


@pytest.mark.parametrize(("body", "param"), [
    ({}, "version"),
    ({"version": "two"}, "version"),
    ({"version": 0}, "version"),
])
async def test_promote_body_errors_name_the_field(fake_client, body, param):
    response = await fake_client.post("/v1/adapters/poet/promote", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


async def test_rollback_of_an_unknown_adapter_is_404(fake_client):
    response = await fake_client.post("/v1/adapters/nope/rollback")
    assert response.status_code == 404 and response.json()["error"]["code"] == "adapter_not_found"


async def test_an_upload_with_a_long_description_is_400(fake_client, demo_assets):
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in demo_assets.adapter_dirs["sql-helper"].iterdir():
            archive.add(path, arcname=path.name)
    response = await fake_client.post("/v1/adapters", params={"name": "long", "description": "d" * 3000},
                                      content=buffer.getvalue(), headers={"content-type": "application/gzip"})
    assert response.status_code == 400, response.text
    assert "description" in response.json()["error"]["message"]


async def test_compose_publishes_a_mixture_with_its_lineage(fake_client, fake_server, demo_assets):
    for name in ("sql-helper", "support-bot"):
        fake_server.registry.push(demo_assets.adapter_dirs[name], name)
    body = {"components": [{"model": "sql-helper@1", "weight": 0.5}, {"model": "support-bot", "weight": 0.5}],
            "description": "half and half"}
    response = await fake_client.post("/v1/adapters/blend/compose", json=body)
    assert response.status_code == 201, response.text
    view = response.json()
    assert (view["name"], view["version"], view["rank"]) == ("blend", 1, 24)
    assert [(p["name"], p["version"], p["weight"]) for p in view["lineage"]["components"]] == [
        ("sql-helper", 1, 0.5), ("support-bot", 1, 0.5)]


@pytest.mark.parametrize("components,status,param", [
    ([{"model": "sql-helper@1", "weight": 1.0}], 400, "components"),
    ([{"model": "sql-helper@1", "weight": 1.0}, {"model": "nope@1", "weight": 1.0}], 404, "components"),
    ([{"model": "sql-helper@1", "weight": 1.0}, {"model": "sql-helper@1", "weight": "NaN"}], 400,
     "components[1].weight"),
])
async def test_compose_refusals(fake_client, fake_server, demo_assets, components, status, param):
    fake_server.registry.push(demo_assets.adapter_dirs["sql-helper"], "sql-helper")
    response = await fake_client.post("/v1/adapters/blend/compose", json={"components": components})
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param
