"""Virtual models over the fake engine: how runs are made, billed and reported (the rules on real logprobs are
tested end to end, tests/e2e/test_virtual_models.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from api.config import LoraplexConfig, ServingOptions
from api.generation.virtual_model_table import GraphError
from api.server.build import build_server
from engine.config import EngineConfig
from tests.api.graphs.conftest import graph_tenancy, tenancy_data


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def chat(client, key, model, **extra):
    return await client.post("/v1/chat/completions", headers=auth(key),
                             json={"model": model, "messages": [{"role": "user", "content": "hi"}],
                                   "max_tokens": 3, **extra})


async def test_cascade_escalates_and_bills_every_stage(graph_client, graph_server, graph_keys, fake_engine):
    r = await chat(graph_client, graph_keys["all"], "always-up")
    assert r.status_code == 200, r.text
    body = r.json()
    info = body["loraplex"]
    assert (info["kind"], info["answered_by"], info["position"]) == ("cascade", "poet@1", 1)
    assert body["model"] == r.headers["x-loraplex-model"] == "poet@1"
    assert r.headers["x-loraplex-virtual-model"] == "always-up" and r.headers["x-loraplex-stage"] == "1"
    assert [(run["model"], run["stage"], run["escalated"], run["reason"]) for run in info["runs"]] == [
        ("sql-helper@1", 0, True, "output_matches"), ("poet@1", 1, False, None)]
    assert body["choices"][0]["logprobs"] is None  # asked for internally, not by the client
    assert body["choices"][0]["message"]["content"] == info["runs"][1]["text"]
    rows = graph_server.ledger.query(tenant="all")
    assert sorted((row["request_id"], row["model"]) for row in rows) == sorted(
        (run["request_id"], run["model"].split("@")[0]) for run in info["runs"])
    assert body["usage"]["completion_tokens"] == sum(row["completion_tokens"] for row in rows) == 6
    assert body["usage"]["prompt_tokens"] == sum(row["prompt_tokens"] for row in rows)
    assert len(fake_engine.requests) == 2


async def test_cascade_first_stage_answers(graph_client, graph_keys, fake_engine):
    r = await graph_client.post("/v1/completions", headers=auth(graph_keys["all"]),
                                json={"model": "never-up", "prompt": "hi", "max_tokens": 2, "logprobs": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "sql-helper@1" and r.headers["x-loraplex-stage"] == "0"
    assert [run["escalated"] for run in body["loraplex"]["runs"]] == [False]
    assert len(fake_engine.requests) == 1
    assert body["choices"][0]["logprobs"] is not None  # the client asked


async def test_ensemble_of_nested_models(graph_client, graph_keys, graph_server):
    r = await chat(graph_client, graph_keys["all"], "vote")
    assert r.status_code == 200, r.text
    info = r.json()["loraplex"]
    # The fake engine gives every model the same text: a three-way agreement, won by the first member.
    assert (info["kind"], info["answered_by"], info["position"]) == ("ensemble", "poet@1", 0)
    assert r.headers["x-loraplex-member"] == "0"
    assert [(run["model"], run["member"], run["chosen"]) for run in info["runs"]] == [
        ("poet@1", 0, True), ("sql-helper@1", 1, False), ("never-up", 2, False)]
    nested = info["runs"][2]
    assert nested["answered_by"] == "sql-helper@1" and nested["text"] == nested["runs"][0]["text"]
    assert [(run["model"], run["stage"], run["escalated"]) for run in nested["runs"]] == [("sql-helper@1", 0, False)]
    assert nested["usage"] == nested["runs"][0]["usage"]
    rows = graph_server.ledger.query(tenant="all")
    leaf_ids = [info["runs"][0]["request_id"], info["runs"][1]["request_id"], nested["runs"][0]["request_id"]]
    assert sorted(row["request_id"] for row in rows) == sorted(leaf_ids)
    assert nested["runs"][0]["request_id"].startswith(nested["request_id"] + ".never-up.")
    assert r.json()["usage"]["completion_tokens"] == sum(row["completion_tokens"] for row in rows)


@pytest.mark.parametrize("extra, param", [({"stream": True}, "stream"), ({"n": 2}, "n")])
async def test_refused_shapes(graph_client, graph_server, graph_keys, fake_engine, extra, param):
    r = await chat(graph_client, graph_keys["all"], "vote", **extra)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"
    assert fake_engine.requests == []
    counted = 'loraplex_requests_total{model="unknown",status="400",tenant="all",version=""} 1.0'
    assert counted in graph_server.metrics.render().decode()


@pytest.mark.parametrize("extra, param", [({"prompt": ["a", "b"]}, "prompt"), ({"echo": True}, "echo")])
async def test_refused_completion_shapes(graph_client, graph_keys, fake_engine, extra, param):
    r = await graph_client.post("/v1/completions", headers=auth(graph_keys["all"]),
                                json={"model": "never-up", "prompt": "a", "max_tokens": 2, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert fake_engine.requests == []


async def test_models_list_only_what_a_tenant_may_run(graph_client, graph_keys):
    listed = {}
    for tenant in ("all", "sql"):
        r = await graph_client.get("/v1/models", headers=auth(graph_keys[tenant]))
        listed[tenant] = {card["id"]: card for card in r.json()["data"] if "kind" in card}
    assert sorted(listed["all"]) == ["always-up", "never-up", "sql-pair", "vote"]
    assert sorted(listed["sql"]) == ["sql-pair"]
    assert listed["all"]["vote"]["members"] == ["poet", "sql-helper", "never-up"]
    card = await graph_client.get("/v1/models/sql-pair", headers=auth(graph_keys["sql"]))
    assert card.json()["kind"] == "ensemble"
    hidden = await graph_client.get("/v1/models/vote", headers=auth(graph_keys["sql"]))
    assert hidden.status_code == 404
    refused = await chat(graph_client, graph_keys["sql"], "always-up")
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    allowed = await chat(graph_client, graph_keys["sql"], "sql-pair")
    assert allowed.status_code == 200


def test_bad_graph_refused_at_start_with_every_problem(fake_engine, graph_registry, graph_keys, demo_assets,
                                                      tmp_path):
    models = {"poet": {"ensemble": {"members": ["sql-helper", "nope"]}},
              "a": {"ensemble": {"members": ["b", "poet@7"]}}, "b": {"ensemble": {"members": ["a", "poet"]}}}
    with pytest.raises(GraphError) as caught:
        build_server(fake_engine, graph_registry, LoraplexConfig(
            engine=EngineConfig(model=str(demo_assets.model_dir)), tenancy=graph_tenancy(graph_keys, models),
            serving=ServingOptions(ledger_url=str(tmp_path / "u.sqlite"))), tiers=None)
    assert [p.split(":")[0] for p in caught.value.problems] == [
        "virtual_models.poet", "virtual_models.poet.ensemble[1]", "virtual_models.a.ensemble[1]", "virtual_models"]


async def test_reload_swaps_whole_or_not_at_all(graph_client, graph_server, graph_keys):
    tenants = graph_server.config.serving.config
    refused = await graph_client.post("/v1/virtual-models/reload", headers=auth(graph_keys["all"]))
    assert refused.status_code == 403
    new = {"pair": {"cascade": {"stages": ["poet", "sql-helper"], "escalate_when": {"mean_logprob_below": -1}}}}
    Path(tenants).write_text(yaml.safe_dump(tenancy_data(graph_keys, new)))
    r = await graph_client.post("/v1/virtual-models/reload", headers=auth(graph_keys["admin"]))
    assert r.status_code == 200, r.text
    assert [m["id"] for m in r.json()["data"]] == ["pair"]
    assert (await chat(graph_client, graph_keys["all"], "vote")).status_code == 404
    bad = {"pair": {"ensemble": {"members": ["ghost", "poet"]}}, "poet": {"ensemble": {"members": ["a", "b"]}}}
    Path(tenants).write_text(yaml.safe_dump(tenancy_data(graph_keys, bad)))
    r = await graph_client.post("/v1/virtual-models/reload", headers=auth(graph_keys["admin"]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_config"
    message = r.json()["error"]["message"]
    assert "unknown member 'ghost'" in message and "clashes with an adapter 'poet'" in message
    assert "unknown member 'a'" in message
    listed = await graph_client.get("/v1/virtual-models", headers=auth(graph_keys["admin"]))
    assert [m["id"] for m in listed.json()["data"]] == ["pair"]  # the previous set stays
