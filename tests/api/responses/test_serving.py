from __future__ import annotations

import pytest

from api.responses.protocol import OutputFunctionCall, OutputMessage, OutputText, ResponsesRequest
from api.responses.serving import chat_request, input_messages, output_messages

CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
CHAT_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _items(items):
    return ResponsesRequest.model_validate({"model": "m", "input": items}).items()


@pytest.mark.parametrize("items,messages", [
    ([{"role": "user", "content": "hi"}], [{"role": "user", "content": "hi"}]),
    ([{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}],
     [{"role": "user", "content": "a\nb"}]),
    ([CALL, {**CALL, "call_id": "c2"}, {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
     [{"role": "assistant", "content": None, "tool_calls": [CHAT_CALL, {**CHAT_CALL, "id": "c2"}]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"}]),
    ([{"role": "assistant", "content": "let me see", "id": "msg_1", "status": "completed"}, CALL],
     [{"role": "assistant", "content": "let me see", "tool_calls": [CHAT_CALL]}]),
])
def test_input_messages(items, messages):
    assert input_messages(_items(items)) == messages


def test_output_messages_continue_as_the_input_would():
    output = [OutputMessage(content=[OutputText(text="let me see")]),
              OutputFunctionCall(call_id="c1", name="f", arguments="{}")]
    assert output_messages(output) == [{"role": "assistant", "content": "let me see", "tool_calls": [CHAT_CALL]}]


@pytest.mark.parametrize("fields,expected", [
    ({"instructions": "be brief"}, {"messages[0]": {"role": "system", "content": "be brief"}}),
    ({"max_output_tokens": 5}, {"max_completion_tokens": 5}),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "f"}},
     {"tool_choice": {"type": "function", "function": {"name": "f"}}}),
    ({"text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}}},
     {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"},
                                                                 "description": None, "strict": None}}}),
])
def test_chat_request(fields, expected):
    req = ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields})
    chat = chat_request(req, history=[]).model_dump(mode="json", by_alias=True)
    for key, value in expected.items():
        if key == "messages[0]":
            assert {k: v for k, v in chat["messages"][0].items() if v is not None} == value
        else:
            assert chat[key] == value
