"""`tool_choice` `auto` through the HTTP layer on the fake engine, with the hermes parser: what the SDK gets from a
reply that is a call and from one that is text, whole and streamed. (Template and engine: tests/e2e.)"""

from __future__ import annotations

import httpx
import pytest
from openai import AsyncOpenAI

from api.app import create_app

TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = 'Checking.<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture
async def sdk(make_fake_server):
    server = make_fake_server(options={"tool_call_parser": "hermes"})
    transport = httpx.ASGITransport(app=create_app(server))
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as http, \
            AsyncOpenAI(base_url="http://fake/v1", api_key="none", http_client=http) as client:
        yield client


def _say(fake_engine, text):
    fake_engine.max_model_len = 256  # room for the call in the tiny tokenizer's many short tokens
    fake_engine.reply_ids = fake_engine.tokenizer().encode(text, add_special_tokens=False)
    fake_engine.last_finish_reason = "stop"
    return fake_engine.tokenizer().decode(fake_engine.reply_ids)


@pytest.mark.parametrize("choice", [None, "auto"])
async def test_a_reply_with_a_call_is_a_tool_call(sdk, fake_engine, choice):
    _say(fake_engine, CALL)
    extra = {} if choice is None else {"tool_choice": choice}
    reply = await sdk.chat.completions.create(model="fake-base", tools=TOOLS, **extra,
                                              messages=[{"role": "user", "content": "weather in Paris?"}])
    choice0 = reply.choices[0]
    assert choice0.finish_reason == "tool_calls" and choice0.message.content == "Checking."
    [call] = choice0.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("weather", '{"city": "Paris"}')
    assert fake_engine.requests[0][2].structured_outputs is None  # auto: nothing constrained


async def test_a_text_reply_is_text(sdk, fake_engine):
    text = _say(fake_engine, "It is sunny.")
    reply = await sdk.chat.completions.create(model="fake-base", tools=TOOLS,
                                              messages=[{"role": "user", "content": "hi"}])
    assert (reply.choices[0].message.content, reply.choices[0].message.tool_calls) == (text, None)
    assert reply.choices[0].finish_reason == "stop"


async def test_streamed_calls_accumulate_as_the_sdk_does(sdk, fake_engine):
    _say(fake_engine, CALL)
    async with sdk.chat.completions.stream(model="fake-base", tools=TOOLS,
                                           messages=[{"role": "user", "content": "weather?"}]) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Checking." and final.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [("weather", '{"city": "Paris"}')]
