"""HTTP-layer behaviour on a fake engine: error shapes, mid-stream failures, health, request ids."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

CHAT = {"model": "fake-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def sse_payloads(text: str) -> list:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


async def test_engine_failure_mid_stream_is_an_sse_error_event(fake_client, fake_engine):
    fake_engine.fail_after = 2
    response = await fake_client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    payloads = sse_payloads(response.text)
    assert response.status_code == 200
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["type"] == "server_error" and error["code"] == "engine_error"
    content = [json.loads(p)["choices"][0]["delta"].get("content") for p in payloads[1:-2]]
    assert len(content) == 2


async def test_openai_client_raises_on_mid_stream_error(fake_app, fake_engine):
    fake_engine.fail_after = 1
    http_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake_app))
    client = openai.AsyncOpenAI(base_url="http://fake/v1", api_key="x", http_client=http_client, max_retries=0)
    stream = await client.chat.completions.create(stream=True, **CHAT)
    with pytest.raises(openai.APIError, match="engine failed"):
        async for _ in stream:
            pass


async def test_engine_failure_before_output_is_500(fake_client, fake_engine):
    fake_engine.fail_after = 0
    response = await fake_client.post("/v1/completions", json={"model": "fake-base", "prompt": "x"})
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"


@pytest.mark.parametrize("stream", [False, True])
async def test_an_engine_finish_reason_error_is_an_error_never_a_200_answer(fake_client, fake_engine, stream):
    fake_engine.last_finish_reason = "error"
    response = await fake_client.post("/v1/completions", json={"model": "fake-base", "prompt": "x", "stream": stream})
    if not stream:
        assert response.status_code == 500 and response.json()["error"]["code"] == "engine_error"
        return
    payloads = sse_payloads(response.text)
    assert json.loads(payloads[-2])["error"]["code"] == "engine_error"
    assert all(json.loads(p)["choices"][0]["finish_reason"] is None for p in payloads[:-2])


async def test_completions_default_to_16_tokens_as_openai(fake_client, fake_engine):
    fake_engine.tokens_per_request = 1000
    await fake_client.post("/v1/completions", json={"model": "fake-base", "prompt": "x"})
    await fake_client.post("/v1/completions", json={"model": "fake-base", "prompt": "x", "max_tokens": None})
    budgets = [params.max_tokens for _, _, params, _ in fake_engine.requests]
    assert budgets[0] == 16 and budgets[1] > 16


async def test_health_is_503_when_engine_dead(fake_client, fake_engine):
    assert (await fake_client.get("/health")).status_code == 200
    fake_engine.alive = False
    response = await fake_client.get("/health")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "engine_dead"


@pytest.mark.parametrize("method,path,status", [("GET", "/v1/nothing", 404), ("GET", "/v1/completions", 405)])
async def test_unknown_routes_are_openai_errors(fake_client, method, path, status):
    response = await fake_client.request(method, path)
    assert response.status_code == status
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


async def test_schema_errors_are_400_and_list_every_problem(fake_client):
    response = await fake_client.post("/v1/chat/completions", json={
        "model": "fake-base", "messages": [{"role": "robot", "content": "x"}], "temperature": 9, "n": 0})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    for field in ("messages[0].role", "temperature", "n"):
        assert field in message


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {**CHAT, "functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ("/v1/completions", {"model": "fake-base", "prompt": "x", "suffix": "y"}, "suffix"),
    ("/v1/completions", {"model": "fake-base", "prompt": "x", "a_field_from_the_future": 1}, "a_field_from_the_future"),
])
async def test_unsupported_parameters_are_refused_by_name(fake_client, path, body, param):
    response = await fake_client.post(path, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsupported_parameter"
    assert response.json()["error"]["param"] == param


async def test_n_choices_and_usage(fake_client, fake_engine):
    response = await fake_client.post("/v1/completions", json={
        "model": "fake-base", "prompt": [[1, 2, 3], [4, 5]], "n": 2, "max_tokens": 3})
    body = response.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert len(fake_engine.requests) == 2


async def test_token_ids_outside_vocab_are_400(fake_client):
    response = await fake_client.post("/v1/completions", json={"model": "fake-base", "prompt": [1, 10**6]})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt"


async def test_max_completion_tokens_over_context_names_it(fake_client):
    response = await fake_client.post("/v1/chat/completions", json={**CHAT, "max_completion_tokens": 1000})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_completion_tokens"


async def test_invalid_request_id_is_replaced(fake_client):
    response = await fake_client.get("/v1/models", headers={"X-Request-Id": "bad id with spaces"})
    assert response.headers["x-request-id"] != "bad id with spaces"
    assert len(response.headers["x-request-id"]) == 32


async def test_failure_in_one_of_several_prompts_fails_the_request_and_aborts_the_rest(fake_client, fake_engine):
    fake_engine.fail_after = 1
    response = await fake_client.post("/v1/completions", json={"model": "fake-base", "prompt": [[1, 2], [3]]})
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "engine_error"
    ids = {request_id for request_id, *_ in fake_engine.requests}
    assert set(fake_engine.aborted) == ids, "every engine call of a failed request is aborted"


async def test_reused_request_id_is_still_billed(fake_client, fake_server):
    """The ledger keeps one row per request id; a client reusing an X-Request-Id must not go unbilled."""
    for _ in range(2):
        response = await fake_client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "dup-1"})
        assert response.status_code == 200
    rows = [r for r in fake_server.ledger.query() if r["request_id"].startswith("dup-1")]
    assert len(rows) == 2 and rows[0]["request_id"] == "dup-1"
    assert all(r["completion_tokens"] == 4 for r in rows)


async def test_each_tenant_gets_its_own_prefix_cache_salt(fake_client, fake_engine, fake_server):
    """The open server has one tenant: every request carries that tenant's salt, a keyed hash of its name."""
    for _ in range(2):
        assert (await fake_client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    salts = set(fake_engine.salts)
    assert len(salts) == 1 and None not in salts
    assert salts == {fake_server.pipeline.cache_salts.salt_of("default")}
    assert fake_server.pipeline.cache_salts.salt_of("other") not in salts
