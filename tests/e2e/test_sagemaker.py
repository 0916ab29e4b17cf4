"""SageMaker's container contract on the real server: /ping, and /invocations giving the same greedy text as the
OpenAI routes for the same request, with the adapter chosen by the custom-attributes header or the body."""

from __future__ import annotations

import json

import httpx

from api.sagemaker.protocol import CUSTOM_ATTRIBUTES_HEADER

MESSAGES = [{"role": "user", "content": "Write about a river."}]
GREEDY = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}


def test_ping_is_ready(server):
    response = httpx.get(f"{server}/ping", timeout=10)
    assert response.status_code == 200 and response.json()["status"] == "ready"


def test_chat_invocation_with_an_adapter_from_custom_attributes_equals_chat_completions(server, acme):
    reference = httpx.post(f"{server}/v1/chat/completions", headers=acme, timeout=120,
                           json={"model": "poet", "messages": MESSAGES, **GREEDY})
    assert reference.status_code == 200, reference.text
    invocation = httpx.post(f"{server}/invocations", timeout=120,
                            headers={**acme, CUSTOM_ATTRIBUTES_HEADER: "trace=e2e;model=poet"},
                            json={"messages": MESSAGES, **GREEDY})
    assert invocation.status_code == 200, invocation.text
    expected, got = reference.json(), invocation.json()
    assert got["model"] == expected["model"] == "poet@1"
    assert got["choices"][0]["message"]["content"] == expected["choices"][0]["message"]["content"]
    assert got["usage"] == expected["usage"]


def test_base_model_invocation_differs_from_the_adapter(server, acme, base_model_id):
    adapter = httpx.post(f"{server}/invocations", headers={**acme, CUSTOM_ATTRIBUTES_HEADER: "model=poet"},
                         json={"messages": MESSAGES, **GREEDY}, timeout=120).json()
    base = httpx.post(f"{server}/invocations", headers=acme, json={"messages": MESSAGES, **GREEDY},
                      timeout=120).json()
    assert base["model"] == base_model_id
    assert base["choices"][0]["message"]["content"] != adapter["choices"][0]["message"]["content"]


def test_streamed_completions_invocation_equals_completions(server, acme):
    body = {"model": "sql-helper", "prompt": "the quick brown fox", **GREEDY}
    reference = httpx.post(f"{server}/v1/completions", headers=acme, json=body, timeout=120)
    assert reference.status_code == 200, reference.text
    with httpx.stream("POST", f"{server}/invocations", headers=acme, json={**body, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200
        payloads = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert {c["model"] for c in chunks} == {"sql-helper@1"}
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == \
        reference.json()["choices"][0]["text"]
