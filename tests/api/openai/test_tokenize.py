"""/tokenize and /detokenize over the fake engine's tokenizer (the real one is the same code path)."""

from __future__ import annotations

import httpx
import pytest

from adapters.demo.assets import SMOLLM2_TOOL_TEMPLATE
from api.app import create_app

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]


async def test_tokenize_a_prompt(fake_client, small_tokenizer):
    r = await fake_client.post("/tokenize", json={"model": "fake-base", "prompt": "hello world",
                                                  "return_token_strs": True})
    assert r.status_code == 200, r.text
    ids = small_tokenizer.encode("hello world", add_special_tokens=True)
    assert r.json() == {"count": len(ids), "max_model_len": 64, "tokens": ids,
                        "token_strs": small_tokenizer.convert_ids_to_tokens(ids)}


@pytest.mark.parametrize("add_generation_prompt", [True, False])
async def test_tokenize_messages_as_the_chat_endpoint_renders_them(fake_client, small_tokenizer,
                                                                   add_generation_prompt):
    r = await fake_client.post("/tokenize", json={"model": "fake-base", "messages": MESSAGES,
                                                  "add_generation_prompt": add_generation_prompt})
    text = small_tokenizer.apply_chat_template(MESSAGES, tokenize=False,
                                               add_generation_prompt=add_generation_prompt)
    assert r.json()["tokens"] == small_tokenizer.encode(text, add_special_tokens=False)


async def test_tools_are_rendered_by_the_servers_chat_template(make_fake_server, small_tokenizer):
    """`--chat-template` replaces the model's own, for chat and /tokenize alike; tools reach it."""
    server = make_fake_server(options={"chat_template": str(SMOLLM2_TOOL_TEMPLATE)})
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(server)), base_url="http://f") as c:
        rendered = [(await c.post("/tokenize", json={"model": "fake-base", "messages": MESSAGES, **extra})).json()
                    for extra in ({}, {"tools": tools})]
    template = SMOLLM2_TOOL_TEMPLATE.read_text()
    for body, extra in zip(rendered, ({}, {"tools": tools})):
        text = small_tokenizer.apply_chat_template(MESSAGES, chat_template=template, tokenize=False,
                                                   add_generation_prompt=True, **extra)
        assert body["tokens"] == small_tokenizer.encode(text, add_special_tokens=False)
    assert '"name": "weather"' in small_tokenizer.decode(rendered[1]["tokens"])


async def test_detokenize_inverts_tokenize(fake_client):
    ids = (await fake_client.post("/tokenize", json={"model": "fake-base", "prompt": "a b c",
                                                     "add_special_tokens": False})).json()["tokens"]
    r = await fake_client.post("/detokenize", json={"model": "fake-base", "tokens": ids})
    assert r.json() == {"prompt": "a b c"}


@pytest.mark.parametrize("path,body,status,param", [
    ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model"),
    ("/tokenize", {"model": "fake-base", "prompt": "x", "truncate": 3}, 400, "truncate"),
    ("/tokenize", {"model": "fake-base", "messages": [{"role": "user", "content": "x", "refusal": "no"}]}, 400,
     "messages[0].refusal"),
    ("/detokenize", {"model": "fake-base", "tokens": [10**9]}, 400, "tokens"),
    ("/detokenize", {"model": "nope", "tokens": [1]}, 404, "model"),
])
async def test_refusals(fake_client, path, body, status, param):
    r = await fake_client.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
