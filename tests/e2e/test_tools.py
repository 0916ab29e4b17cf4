"""Tool calling through the real openai SDK on the real engine: a forced call (`required`, or a named function)
is generated under the tools' schemas, so even the random tiny model returns calls that parse and validate, on
the base model and on adapters, streamed (as the SDK accumulates deltas) or not."""

from __future__ import annotations

from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field


class Weather(BaseModel):
    city: Literal["paris", "tokyo", "lima"]
    unit: Literal["c", "f"]


class Clock(BaseModel):
    zone: str = Field(max_length=5)


TOOLS = [openai.pydantic_function_tool(Weather), openai.pydantic_function_tool(Clock)]
SCHEMAS = {"Weather": Weather, "Clock": Clock}
QUESTION = [{"role": "user", "content": "what is the weather in paris?"}]


@pytest.mark.parametrize("model_index", [None, 0, 2])
def test_required_returns_a_call_that_matches_the_schemas(openai_client, base_model_id, adapter_names, model_index):
    model = base_model_id if model_index is None else adapter_names[model_index]
    response = openai_client.chat.completions.create(model=model, messages=QUESTION, tools=TOOLS,
                                                     tool_choice="required", max_tokens=96, temperature=0,
                                                     parallel_tool_calls=False)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        SCHEMAS[call.function.name].model_validate_json(call.function.arguments)
        assert call.id.startswith("call_") and call.type == "function"


def test_streamed_required_calls_equal_the_whole_answer(openai_client, adapter_names):
    kwargs = dict(model=adapter_names[1], messages=QUESTION, tools=TOOLS, tool_choice="required", max_tokens=96,
                  temperature=0, parallel_tool_calls=False)
    whole = openai_client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    with openai_client.chat.completions.stream(**kwargs) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert len(whole) == 1
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
           [(c.function.name, c.function.arguments) for c in whole]


def test_a_named_function_streams_its_arguments_and_the_sdk_parses_them(openai_client, adapter_names):
    with openai_client.chat.completions.stream(
            model=adapter_names[0], messages=QUESTION, tools=TOOLS, max_tokens=64, temperature=0,
            tool_choice={"type": "function", "function": {"name": "Weather"}}) as stream:
        argument_events = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion().choices[0]
    assert len(argument_events) > 1, "arguments arrive as they are generated"
    call, = final.message.tool_calls
    assert call.function.name == "Weather" and isinstance(call.function.parsed_arguments, Weather)
    assert final.finish_reason == "stop"


def test_a_tool_round_trip_renders_the_calls_and_answers_into_the_prompt(openai_client, tokenizer, adapter_names):
    first = openai_client.chat.completions.create(
        model=adapter_names[0], messages=QUESTION, tools=TOOLS, max_tokens=64, temperature=0,
        tool_choice={"type": "function", "function": {"name": "Weather"}}).choices[0].message
    history = [*QUESTION, first.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "sunny, 21 degrees"}]
    answer = openai_client.chat.completions.create(model=adapter_names[0], messages=history, tools=TOOLS,
                                                   tool_choice="none", max_tokens=4, temperature=0,
                                                   extra_body={"return_token_ids": True})
    assert answer.choices[0].message.content is not None
    assert "sunny, 21 degrees" in tokenizer.decode(answer.model_extra["prompt_token_ids"])


def test_auto_is_refused_by_name(openai_client, base_model_id):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model=base_model_id, messages=QUESTION, tools=TOOLS, max_tokens=4)
    assert info.value.body["param"] == "tool_choice" and info.value.body["code"] == "unsupported_parameter"
