"""/v1/responses through the HTTP layer on the fake engine: the SDK parses what it returns and streams; stored
responses per tenant. (Engine behaviour is tested on the real engine: tests/e2e/test_responses.py.)"""

from __future__ import annotations

import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError

TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture
async def sdk(fake_client):
    async with AsyncOpenAI(base_url="http://fake/v1", api_key="none", http_client=fake_client) as client:
        yield client


async def test_create_returns_a_response_the_sdk_parses_and_stores_it(sdk, fake_engine):
    response = await sdk.responses.create(model="fake-base", input="hello", instructions="be brief",
                                          max_output_tokens=8, metadata={"k": "v"})
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == fake_engine.tokenizer().decode([100, 101, 102, 103])
    assert response.usage.output_tokens == 4 and response.usage.input_tokens == len(fake_engine.requests[0][1])
    assert response.metadata == {"k": "v"} and response.instructions == "be brief"
    again = await sdk.responses.retrieve(response.id)
    assert again.model_dump() == response.model_dump()


async def test_stream_events_in_order_and_the_completed_response(sdk, fake_engine):
    fake_engine.last_finish_reason = "stop"
    stream = await sdk.responses.create(model="fake-base", input="hello", stream=True)
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.status == "completed" and final.output_text == deltas and final.usage.output_tokens == 4
    assert (await sdk.responses.retrieve(final.id)).output_text == deltas


async def test_previous_response_id_continues_the_stored_conversation(sdk, fake_engine):
    first = await sdk.responses.create(model="fake-base", input="first question", instructions="only once")
    await sdk.responses.create(model="fake-base", input="second question", previous_response_id=first.id)
    prompt = fake_engine.tokenizer().decode(fake_engine.requests[1][1])
    assert "first question" in prompt and first.output_text in prompt and "second question" in prompt
    assert "only once" not in prompt  # instructions apply to their own turn


async def test_forced_function_call_and_its_output_in_the_next_turn(sdk, fake_engine):
    fake_engine.reply_ids = fake_engine.tokenizer().encode('{"city":"Paris"}', add_special_tokens=False)
    fake_engine.last_finish_reason = "stop"
    response = await sdk.responses.create(model="fake-base", input="weather?", tools=[TOOL],
                                          tool_choice={"type": "function", "name": "get_weather"})
    params = fake_engine.requests[0][2]
    assert params.structured_outputs.json == TOOL["parameters"]
    call = response.output[0]
    assert (call.type, call.name, call.arguments) == ("function_call", "get_weather", '{"city":"Paris"}')
    await sdk.responses.create(model="fake-base", tools=[TOOL], tool_choice="none", input=[
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    assert "sunny" in fake_engine.tokenizer().decode(fake_engine.requests[1][1])


@pytest.mark.parametrize("extra,param", [
    ({"truncation": "auto"}, "truncation"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"brand_new": 1}, "brand_new"),
])
async def test_unsupported_parameters_are_refused_by_name(sdk, extra, param):
    with pytest.raises(BadRequestError) as info:
        await sdk.responses.create(model="fake-base", input="x", extra_body=extra)
    assert info.value.body["param"] == param and info.value.body["code"] == "unsupported_parameter"


async def test_accepted_no_ops_and_values_that_ask_nothing(sdk):
    response = await sdk.responses.create(model="fake-base", input="x", truncation="disabled", include=[],
                                          service_tier="auto", prompt_cache_key="k")
    assert response.status in ("completed", "incomplete")


async def test_unknown_previous_response_and_retrieve_are_404(sdk):
    with pytest.raises(NotFoundError) as info:
        await sdk.responses.create(model="fake-base", input="x", previous_response_id="resp-nope")
    assert info.value.body["param"] == "previous_response_id"
    with pytest.raises(NotFoundError):
        await sdk.responses.retrieve("resp-nope")


async def test_store_false_keeps_nothing_and_delete_removes(sdk):
    unstored = await sdk.responses.create(model="fake-base", input="x", store=False)
    with pytest.raises(NotFoundError):
        await sdk.responses.retrieve(unstored.id)
    stored = await sdk.responses.create(model="fake-base", input="x")
    await sdk.responses.delete(stored.id)
    with pytest.raises(NotFoundError):
        await sdk.responses.retrieve(stored.id)
