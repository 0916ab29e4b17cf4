"""GET /ping and POST /invocations on the fake engine: readiness, body shapes, model choice, streaming, errors."""

from __future__ import annotations

import json

import pytest

from api.sagemaker.protocol import CUSTOM_ATTRIBUTES_HEADER

MESSAGES = [{"role": "user", "content": "hi"}]
CHAT = {"messages": MESSAGES, "max_tokens": 4}
COMPLETION = {"prompt": "the quick brown fox", "max_tokens": 4}


@pytest.fixture
def server_with_poet(fake_server, demo_assets):
    fake_server.registry.push(demo_assets.adapter_dirs["poet"], "poet")
    fake_server.lifecycle.ready = True
    return fake_server


async def test_ping_follows_readiness(fake_client, fake_server, fake_engine):
    starting = await fake_client.get("/ping")
    assert starting.status_code == 503 and starting.json()["error"]["code"] == "not_ready"
    fake_server.lifecycle.ready = True
    ready = await fake_client.get("/ping")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "model": "fake-base"}
    fake_server.lifecycle.draining = True
    draining = await fake_client.get("/ping")
    assert draining.status_code == 503 and draining.json()["error"]["code"] == "draining"
    fake_server.lifecycle.draining, fake_engine.alive = False, False
    assert (await fake_client.get("/ping")).status_code == 503


async def test_chat_shape_is_a_chat_completion(fake_client, server_with_poet):
    response = await fake_client.post("/invocations", json=CHAT)
    body = response.json()
    assert response.status_code == 200, body
    assert body["object"] == "chat.completion" and body["model"] == "fake-base"
    assert body["choices"][0]["message"]["role"] == "assistant" and body["usage"]["completion_tokens"] == 4


async def test_completions_shape_is_a_text_completion(fake_client, server_with_poet):
    response = await fake_client.post("/invocations", json=COMPLETION)
    body = response.json()
    assert response.status_code == 200, body
    assert body["object"] == "text_completion" and body["model"] == "fake-base"
    assert body["choices"][0]["text"]


@pytest.mark.parametrize(("payload", "header", "served"), [
    (CHAT, None, "fake-base"),
    (CHAT, "model=poet", "poet@1"),
    (CHAT, "trace=1; model=poet@1", "poet@1"),
    ({**CHAT, "model": "poet"}, None, "poet@1"),
    ({**CHAT, "model": "fake-base"}, "model=poet", "fake-base"),
    ({**CHAT, "model": None}, "model=poet", "poet@1"),
    (CHAT, "model=", "fake-base"),
    (CHAT, "other=poet", "fake-base"),
    (COMPLETION, "model=poet", "poet@1"),
])
async def test_model_from_body_else_custom_attributes_else_base(fake_client, server_with_poet, payload, header,
                                                                served):
    headers = {CUSTOM_ATTRIBUTES_HEADER: header} if header is not None else {}
    response = await fake_client.post("/invocations", json=payload, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == served and response.headers["x-loraplex-model"] == served


async def test_streaming_is_sse_ending_in_done(fake_client, server_with_poet):
    headers = {CUSTOM_ATTRIBUTES_HEADER: "model=poet"}
    response = await fake_client.post("/invocations", json={**CHAT, "stream": True}, headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and {c["model"] for c in chunks} == {"poet@1"}
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


@pytest.mark.parametrize(("payload", "header", "status", "code"), [
    ({"inputs": "hi"}, None, 400, "invalid_invocation"),
    ({**CHAT, "prompt": "x"}, None, 400, "invalid_invocation"),
    (CHAT, "model=poet,model=sql-helper", 400, "invalid_custom_attributes"),
    (CHAT, "model=nope", 404, "model_not_found"),
    ({**CHAT, "model": ""}, None, 400, "invalid_value"),
    ({**CHAT, "temperature": 5}, None, 400, "invalid_value"),
    ({"messages": MESSAGES, "functions": [{"name": "f"}]}, None, 400, "unsupported_parameter"),
])
async def test_errors_are_openai_shaped(fake_client, server_with_poet, payload, header, status, code):
    headers = {CUSTOM_ATTRIBUTES_HEADER: header} if header is not None else {}
    response = await fake_client.post("/invocations", json=payload, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and set(error) == {"message", "type", "param", "code"}


async def test_the_custom_attributes_error_names_the_header(fake_client, server_with_poet):
    response = await fake_client.post("/invocations", json=CHAT,
                                      headers={CUSTOM_ATTRIBUTES_HEADER: "model=a;model=b"})
    assert response.json()["error"]["param"] == CUSTOM_ATTRIBUTES_HEADER


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]"])
async def test_a_body_that_is_not_a_json_object_is_400(fake_client, server_with_poet, raw):
    response = await fake_client.post("/invocations", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


async def test_refusals_are_counted_like_the_openai_routes(fake_client, server_with_poet):
    await fake_client.post("/invocations", json={"inputs": "hi"})
    metrics = (await fake_client.get("/metrics")).text
    assert 'loraplex_requests_total{model="unknown",status="400",tenant="default",version=""}' in metrics


async def test_the_engine_gets_the_same_request_as_through_chat_completions(fake_client, server_with_poet,
                                                                            fake_engine):
    payload = {**CHAT, "model": "poet", "temperature": 0, "seed": 7}
    await fake_client.post("/v1/chat/completions", json=payload)
    await fake_client.post("/invocations", json=payload)
    (_, openai_prompt, openai_params, _), (_, sm_prompt, sm_params, _) = fake_engine.requests
    assert sm_prompt == openai_prompt
    assert (sm_params.temperature, sm_params.seed, sm_params.max_tokens) == \
        (openai_params.temperature, openai_params.seed, openai_params.max_tokens) == (0, 7, 4)


async def test_draining_refuses_invocations(fake_client, server_with_poet):
    server_with_poet.lifecycle.draining = True
    response = await fake_client.post("/invocations", json=CHAT)
    assert response.status_code == 503 and response.json()["error"]["code"] == "draining"
