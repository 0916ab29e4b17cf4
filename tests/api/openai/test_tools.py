from __future__ import annotations

import json

import pytest

from api.errors import OpenAIError
from api.openai.chat import assistant_reply
from api.openai.tools import NamedToolChoice, ToolDefinition, tool_calls_of, tool_schema

WEATHER = ToolDefinition.model_validate({"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
CLOCK = ToolDefinition.model_validate({"type": "function", "function": {"name": "clock"}})
NAMED = NamedToolChoice.model_validate({"type": "function", "function": {"name": "weather"}})


@pytest.mark.parametrize("tools,choice,param,code", [
    ([WEATHER], None, "tool_choice", "unsupported_parameter"),
    ([WEATHER], "auto", "tool_choice", "unsupported_parameter"),
    (None, "required", "tool_choice", "invalid_value"),
    ([CLOCK], NAMED, "tool_choice.function.name", "invalid_value"),
])
def test_tool_schema_refusals(tools, choice, param, code):
    with pytest.raises(OpenAIError) as info:
        tool_schema(tools, choice, None)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)


def test_tool_schema_by_choice():
    assert tool_schema(None, None, None) is None
    assert tool_schema([WEATHER], "none", None) is None
    assert tool_schema([WEATHER, CLOCK], NAMED, None) == WEATHER.function.parameters
    required = tool_schema([WEATHER, CLOCK], "required", None)
    assert [o["properties"]["name"] for o in required["items"]["anyOf"]] == [{"enum": ["weather"]}, {"enum": ["clock"]}]
    assert required["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object", "properties": {}}
    assert "maxItems" not in required
    assert tool_schema([WEATHER], "required", False)["maxItems"] == 1


@pytest.mark.parametrize("text,choice,calls", [
    ('{"city":"x"}', NAMED, [("weather", '{"city":"x"}')]),
    ('[{"name":"clock","parameters":{}},{"name":"weather","parameters":{"city":"y"}}]', "required",
     [("clock", "{}"), ("weather", '{"city": "y"}')]),
    ('[{"name":"clock","param', "required", None),
])
def test_tool_calls_of(text, choice, calls):
    found = tool_calls_of(text, choice)
    if calls is None:
        assert found is None
        return
    assert [(c.function.name, c.function.arguments) for c in found] == calls
    assert all(json.loads(c.function.arguments) is not None and c.id.startswith("call_") for c in found)


@pytest.mark.parametrize("text,finish,choice,expected", [
    ("hello", "length", None, ("hello", None, "length")),
    ('{"city":"x"}', "stop", NAMED, (None, 1, "stop")),
    ('[{"name":"clock","parameters":{}}]', "stop", "required", (None, 1, "tool_calls")),
    ('[{"name":"cl', "length", "required", ('[{"name":"cl', None, "length")),
])
def test_assistant_reply(text, finish, choice, expected):
    message, reason = assistant_reply(text, finish, choice)
    calls = len(message.tool_calls) if message.tool_calls else None
    assert (message.content, calls, reason) == expected
