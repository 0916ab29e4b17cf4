"""The routing API and the routing step over HTTP, around the fake engine (real registry index, ledger, metrics)."""

from __future__ import annotations

import pytest


@pytest.fixture
def published(fake_server, demo_assets):
    """`sql` with versions 1 (stable) and 2."""
    registry = fake_server.registry
    registry.push(demo_assets.adapter_dirs["sql-helper"], "sql")
    registry.push(demo_assets.adapter_dirs["support-bot"], "sql")
    registry.promote("sql", 1)
    return registry


def completion(model: str, user: str | None = None) -> dict:
    body = {"model": model, "prompt": "hi", "max_tokens": 2}
    return {**body, "user": user} if user else body


async def test_rollout_lifecycle_over_http(fake_client, fake_server, published):
    started = await fake_client.post("/v1/adapters/sql/rollout", json={"candidate": 2, "percent": 100})
    assert started.status_code == 201, started.text
    assert started.json()["stable"] == "sql@1" and started.json()["policy"] == "canary"
    again = await fake_client.post("/v1/adapters/sql/rollout", json={"candidate": 2, "percent": 10})
    assert again.status_code == 409 and again.json()["error"]["code"] == "rollout_conflict"

    response = await fake_client.post("/v1/completions", json=completion("sql"), headers={"x-request-id": "rq-1"})
    assert response.status_code == 200
    assert response.json()["model"] == response.headers["x-loraplex-model"] == "sql@2"
    assert response.headers["x-loraplex-route"] == f"canary;arm=candidate;rollout={started.json()['id']}"
    pinned = await fake_client.post("/v1/completions", json=completion("sql@1"))
    assert pinned.headers["x-loraplex-model"] == "sql@1" and pinned.headers["x-loraplex-route"] == "pinned"
    [row] = [r for r in fake_server.ledger.query() if r["request_id"] == "rq-1"]
    assert row["route"] == f"canary;arm=candidate;rollout={started.json()['id']}" and row["version"] == "2"

    feedback = await fake_client.post("/v1/feedback", json={"request_id": "rq-1", "score": 1})
    assert feedback.status_code == 200, feedback.text
    unknown = await fake_client.post("/v1/feedback", json={"request_id": "nope", "score": 1})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "request_id"
    bad = await fake_client.post("/v1/feedback", json={"request_id": "rq-1", "score": 3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "score"

    report = (await fake_client.get("/v1/adapters/sql/rollout")).json()
    candidate = report["arms"][1]
    assert (candidate["requests"], candidate["feedback_count"], candidate["feedback_mean"]) == (1, 1, 1.0)
    assert report["comparisons"][0]["verdict"].startswith("not enough data")

    listing = (await fake_client.get("/v1/rollouts")).json()
    assert [r["state"] for r in listing["data"]] == ["active"]
    aborted = await fake_client.post("/v1/adapters/sql/rollout/abort", json={"reason": "test"})
    assert aborted.json()["state"] == "aborted" and aborted.json()["reason"] == "test"
    back = await fake_client.post("/v1/completions", json=completion("sql"))
    assert back.headers["x-loraplex-model"] == "sql@1" and back.headers["x-loraplex-route"] == "direct"

    await fake_client.post("/v1/adapters/sql/rollout", json={"candidate": 2, "percent": 0})
    promoted = await fake_client.post("/v1/adapters/sql/rollout/promote")
    assert promoted.json()["state"] == "promoted"
    after = await fake_client.post("/v1/completions", json=completion("sql"))
    assert after.headers["x-loraplex-model"] == "sql@2"
    none = await fake_client.post("/v1/adapters/sql/rollout/abort")
    assert none.status_code == 404 and none.json()["error"]["code"] == "no_active_rollout"


@pytest.mark.parametrize(("path", "body", "status", "param"), [
    ("/v1/adapters/sql/rollout", {"candidate": 9, "percent": 10}, 404, "candidate"),
    ("/v1/adapters/sql/rollout", {"candidate": 2, "percent": 101}, 400, "percent"),
    ("/v1/adapters/sql/rollout", {"candidate": 2, "percent": 10, "guard": {"max_error_rate": 2}}, 400, "guard"),
    ("/v1/adapters/NOPE/rollout", {"candidate": 2, "percent": 10}, 400, "name"),
])
async def test_rollout_errors(fake_client, published, path, body, status, param):
    response = await fake_client.post(path, json=body)
    assert response.status_code == status, response.text
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert response.json()["error"]["param"].startswith(param)


async def test_sticky_users_keep_their_version(fake_client, published):
    await fake_client.post("/v1/adapters/sql/rollout", json={"candidate": 2, "percent": 50, "sticky": True})
    seen = {}
    for user in (f"user-{i}" for i in range(12)):
        for _ in range(3):
            response = await fake_client.post("/v1/completions", json=completion("sql", user))
            seen.setdefault(user, set()).add(response.headers["x-loraplex-model"])
    assert all(len(models) == 1 for models in seen.values())
    assert set().union(*seen.values()) == {"sql@1", "sql@2"}


async def test_fallback_chain_setting_and_metrics(fake_client, published):
    response = await fake_client.put("/v1/adapters/sql/fallback", json={"previous": True, "base": False})
    assert response.status_code == 200 and response.json() == {"previous": True, "base": False, "name": "sql"}
    await fake_client.post("/v1/adapters/sql/rollout", json={"candidate": 2, "percent": 100})
    await fake_client.post("/v1/completions", json=completion("sql"))
    metrics = (await fake_client.get("/metrics")).text
    assert 'loraplex_rollout_requests_total{adapter="sql",arm="candidate"} 1.0' in metrics
    assert 'loraplex_breaker_state{adapter_version="sql@2"} 0.0' in metrics


async def test_dashboard_data_has_the_routing_panel(fake_client, published):
    await fake_client.post("/v1/adapters/sql/rollout", json={"candidate": 2, "percent": 100})
    await fake_client.post("/v1/completions", json=completion("sql"))
    panel = (await fake_client.get("/dashboard/data")).json()["routing"]
    [rollout] = panel["rollouts"]
    assert rollout["name"] == "sql" and rollout["arms"][1]["requests"] == 1
    assert panel["breakers"] == {"sql@2": "closed"}

