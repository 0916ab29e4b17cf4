"""`echo` on /v1/completions over the fake engine (whose prompt position i has log-probability -i): what an
evaluation harness scoring answers by log-likelihood sends. The real engine's values: tests/e2e."""

from __future__ import annotations

import json

import pytest

from tests.api.test_app import sse_payloads

PROMPT = "the cat sat"


def _body(**fields) -> dict:
    return {"model": "fake-base", "prompt": PROMPT, "max_tokens": 2, "echo": True, **fields}


async def test_echo_leads_every_choice_with_its_prompt(fake_client):
    response = await fake_client.post("/v1/completions", json=_body(n=2, prompt=[PROMPT, "a dog"]))
    texts = [c["text"] for c in response.json()["choices"]]
    assert [t[:len(p)] for t, p in zip(texts, [PROMPT, PROMPT, "a dog", "a dog"])] == [PROMPT, PROMPT, "a dog",
                                                                                     "a dog"]
    assert all(len(t) > len(p) for t, p in zip(texts, [PROMPT, PROMPT, "a dog", "a dog"]))


async def test_streamed_echo_sends_the_prompt_once_per_choice(fake_client):
    response = await fake_client.post("/v1/completions", json=_body(n=2, stream=True))
    whole = (await fake_client.post("/v1/completions", json=_body(n=2))).json()["choices"]
    texts = ["", ""]
    for payload in sse_payloads(response.text)[:-1]:
        for choice in json.loads(payload)["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == [c["text"] for c in whole]


async def test_max_tokens_0_returns_the_prompt_and_its_logprobs_and_bills_no_output(fake_client, fake_engine,
                                                                                    fake_server, small_tokenizer):
    response = await fake_client.post("/v1/completions", json=_body(max_tokens=0, logprobs=1),
                                      headers={"X-Request-Id": "echo-0"})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    ids = small_tokenizer.encode(PROMPT, add_special_tokens=False)
    assert choice["text"] == PROMPT
    assert choice["logprobs"]["tokens"] == [small_tokenizer.decode([t]) for t in ids]
    assert choice["logprobs"]["token_logprobs"] == [None, *(-float(i) for i in range(1, len(ids)))]
    assert choice["logprobs"]["top_logprobs"][0] is None
    assert response.json()["usage"]["completion_tokens"] == 0
    (_, _, params, _), = fake_engine.requests
    assert (params.max_tokens, params.prompt_logprobs) == (1, 1)
    row, = [r for r in fake_server.ledger.query() if r["request_id"] == "echo-0"]
    assert row["completion_tokens"] == 0 and row["prompt_tokens"] == len(ids)


async def test_echo_of_token_ids_is_their_text(fake_client, small_tokenizer):
    ids = small_tokenizer.encode(PROMPT, add_special_tokens=False)
    response = await fake_client.post("/v1/completions", json=_body(prompt=ids, max_tokens=0))
    assert response.json()["choices"][0]["text"] == small_tokenizer.decode(ids)


@pytest.mark.parametrize("fields", [{"echo": False, "max_tokens": 0}])
async def test_max_tokens_0_without_echo_is_400(fake_client, fields):
    response = await fake_client.post("/v1/completions", json=_body(**fields))
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"
