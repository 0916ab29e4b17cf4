from __future__ import annotations

import json

import pytest

from api.errors import OpenAIError
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from api.openai.structured import (
    MAX_REPEAT_TOTAL,
    checked_constraint,
    constraint_of,
    escape_controls,
    json_safe,
    repeat_total,
)
from engine.types import ChoiceDelta

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _req(**fields) -> CompletionRequest:
    return CompletionRequest(model="m", prompt="x", **fields)


@pytest.mark.parametrize("pattern,total", [
    ("abc", 0), ("a{3}", 3), ("a{2,5}", 5), ("a{4,}", 4), ("(a{1,20}b{1,20}){1,20}", 60), ("[a-z]{1,9000}", 9000),
])
def test_repeat_total(pattern, total):
    assert repeat_total(pattern) == total


@pytest.mark.parametrize("fields,expected,param", [
    ({}, None, ""),
    ({"response_format": {"type": "text"}}, None, ""),
    ({"response_format": {"type": "json_object"}}, {"json_object": True}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}}},
     {"json": SCHEMA}, "response_format"),
    ({"structured_outputs": {"json": SCHEMA}}, {"json": SCHEMA}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "[ab]+"}}, {"regex": "[ab]+"}, "structured_outputs.regex"),
    ({"structured_outputs": {"choice": ["x", "y"]}}, {"choice": ["x", "y"]}, "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, {"grammar": 'root ::= "a"'}, "structured_outputs.grammar"),
])
def test_constraint_of(fields, expected, param):
    so, got_param = constraint_of(_req(**fields))
    assert got_param == param
    if expected is None:
        assert so is None
        return
    for name, value in expected.items():
        assert getattr(so, name) == value, name


async def test_a_valid_constraint_passes_and_is_not_rewritten():
    req = _req(structured_outputs={"choice": ["x", "y"]})
    so = await checked_constraint(req)
    assert so.choice == ["x", "y"] and so.grammar is None  # vLLM's check rewrote only its copy


@pytest.mark.parametrize("fields,param,code", [
    ({"structured_outputs": {"json": {"type": "string", "pattern": f"[a-z]{{1,{MAX_REPEAT_TOTAL + 1}}}"}}},
     "structured_outputs.json", "constraint_too_large"),
    ({"structured_outputs": {"regex": "(a{1,600}){1,600}"}}, "structured_outputs.regex", "constraint_too_large"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex", "invalid_value"),
    ({"structured_outputs": {"json": {"type": "object", "properties": {f"p{i}": {"type": "integer"}
                                                                       for i in range(4000)}}}},
     "structured_outputs.json", "constraint_too_large"),
    ({"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs.grammar", "invalid_value"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json", "invalid_value"),
])
async def test_a_bad_constraint_is_a_400_naming_the_field(fields, param, code):
    with pytest.raises(OpenAIError) as info:
        await checked_constraint(_req(**fields))
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)


async def test_a_schema_for_chat_is_checked_like_one_for_completions():
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "pattern": "a{1,5000}"}}}
    with pytest.raises(OpenAIError) as info:
        await checked_constraint(ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}],
                                                       response_format=fmt))
    assert info.value.param == "response_format"


@pytest.mark.parametrize("text,escaped", [
    ('{"a":"x"}', '{"a":"x"}'), ('{"a":"x\ty"}', '{"a":"x\\ty"}'), ('"\x00\x1f\n"', '"\\u0000\\u001f\\n"'),
])
def test_escape_controls_makes_strict_json(text, escaped):
    assert escape_controls(text) == escaped
    json.loads(escaped)


@pytest.mark.parametrize("fields,escapes", [
    ({"response_format": {"type": "json_object"}}, True),
    ({"structured_outputs": {"json": SCHEMA}}, True),
    ({"structured_outputs": {"regex": "a\tb"}}, False),
    ({}, False),
])
async def test_json_safe_escapes_only_json_outputs(fields, escapes):
    async def deltas():
        yield ChoiceDelta(index=0, text='{"a":"x\t', token_ids=(1,))

    out = [d.text async for d in json_safe(_req(**fields), deltas())]
    assert out == (['{"a":"x\\t'] if escapes else ['{"a":"x\t'])
