from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.errors import OpenAIError, from_validation_error
from api.openai.protocol import ChatCompletionRequest, CompletionRequest

MSG = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("fields", [
    {"messages": []},
    {"messages": MSG, "max_tokens": 0},
    {"messages": MSG, "max_tokens": -5},
    {"messages": MSG, "n": 17},
    {"messages": MSG, "temperature": -0.1},
    {"messages": MSG, "temperature": 2.1},
    {"messages": MSG, "top_p": 0},
    {"messages": MSG, "top_p": 1.01},
    {"messages": MSG, "presence_penalty": 3},
    {"messages": MSG, "top_logprobs": 21},
    {"messages": MSG, "stop": ["a", "b", "c", "d", "e"]},
    {"messages": MSG, "stream_options": {"include_usage": True}},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
])
def test_chat_request_rejects(fields):
    with pytest.raises(ValidationError):
        ChatCompletionRequest(model="m", **fields)


@pytest.mark.parametrize("fields", [
    {"messages": MSG},
    {"messages": MSG, "max_tokens": 1, "n": 16, "temperature": 0, "top_p": 1, "top_logprobs": 20,
     "logprobs": True, "stop": "x", "stream": True, "stream_options": {"include_usage": True}},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
])
def test_chat_request_accepts(fields):
    ChatCompletionRequest(model="m", **fields)


def test_content_parts_are_joined_by_newlines_as_vllm_joins_them():
    req = ChatCompletionRequest(model="m", messages=[
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert req.messages[0].text() == "a\nb"


@pytest.mark.parametrize("prompt,ok", [("x", True), (["a", "b"], True), ([1, 2], True), ([[1], [2, 3]], True),
                                       ([], False), ({"a": 1}, False)])
def test_completion_prompt_shapes(prompt, ok):
    if ok:
        CompletionRequest(model="m", prompt=prompt)
    else:
        with pytest.raises(ValidationError):
            CompletionRequest(model="m", prompt=prompt)


def test_validation_error_lists_every_problem_and_names_first_param():
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest(model="m", messages=MSG, temperature=-1, top_p=5)
    err = from_validation_error(info.value)
    assert err.status == 400 and err.param == "temperature"
    assert "temperature" in err.message and "top_p" in err.message


@pytest.mark.parametrize("status,type_", [(400, "invalid_request_error"), (401, "authentication_error"),
                                          (404, "invalid_request_error"), (429, "rate_limit_error"),
                                          (500, "server_error"), (503, "service_unavailable_error")])
def test_error_types_by_status(status, type_):
    body = OpenAIError(status, "m", param="p", code="c").body()
    assert body == {"error": {"message": "m", "type": type_, "param": "p", "code": "c"}}


@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "json_schema"}},
    {"response_format": {"type": "json_object", "json_schema": {"name": "a", "schema": {}}}},
    {"response_format": {"type": "xml"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "has space", "schema": {}}}},
    {"structured_outputs": {}},
    {"structured_outputs": {"regex": "a", "choice": ["a"]}},
    {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
    {"structured_outputs": {"choice": []}},
    {"logit_bias": {"1": 101}},
    {"min_p": 1.5},
    {"stop_token_ids": [-1]},
    {"reasoning_effort": "extreme"},
    {"modalities": ["text", "audio"]},
    {"messages": [{"role": "function", "content": "x", "name": "f"}]},
    {"messages": [{"role": "tool", "content": "x"}]},
    {"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
    {"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "c", "type": "function",
                                                                   "function": {"name": "f", "arguments": "{}"}}]}]},
])
def test_chat_request_rejects_bad_new_fields(fields):
    with pytest.raises(ValidationError):
        ChatCompletionRequest(model="m", **{"messages": MSG, **fields})


@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "text"}},
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "a_b-1", "schema": {"type": "object"},
                                                                 "strict": True}}},
    {"structured_outputs": {"choice": ["yes", "no"]}},
    {"structured_outputs": {"json": {"type": "integer"}}, "response_format": {"type": "text"}},
    {"logit_bias": {"7": -100, "8": 100}, "min_p": 0.1, "stop_token_ids": [2]},
    {"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False}, "modalities": ["text"]},
    {"messages": [{"role": "user", "content": "x", "name": "ann"}]},
])
def test_chat_request_accepts_new_fields(fields):
    ChatCompletionRequest(model="m", **{"messages": MSG, **fields})


@pytest.mark.parametrize("fields,max_tokens,ok", [
    ({}, 16, True),
    ({"max_tokens": None}, None, True),
    ({"max_tokens": 5}, 5, True),
    ({"best_of": 2, "n": 2}, 16, True),
    ({"best_of": 3}, None, False),
])
def test_completion_defaults_and_best_of(fields, max_tokens, ok):
    if not ok:
        with pytest.raises(ValidationError):
            CompletionRequest(model="m", prompt="x", **fields)
        return
    assert CompletionRequest(model="m", prompt="x", **fields).output_limit().tokens == max_tokens
