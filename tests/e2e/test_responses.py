"""The Responses API on the real engine, through the real openai SDK: the same greedy tokens as chat for the base
model and an adapter, whole and streamed; structured output; stored responses per tenant, billed once per call.
(The Agents SDK's round trip runs on SmolLM2, whose server parses `auto` calls: tests/e2e/test_smollm2.py.)"""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.conftest import ledger_rows

QUESTION = "Tell me about the sea."


def _sdk(server, keys, tenant):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=keys.tenants[tenant], max_retries=0, timeout=120)


@pytest.mark.parametrize("model_index", [None, 1])
def test_greedy_output_equals_chat_whole_and_streamed(openai_client, base_model_id, adapter_names, model_index):
    model = base_model_id if model_index is None else adapter_names[model_index]
    chat = openai_client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                                 max_tokens=12, temperature=0)
    whole = openai_client.responses.create(model=model, input=QUESTION, max_output_tokens=12, temperature=0)
    assert whole.output_text == chat.choices[0].message.content and whole.model == chat.model
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (chat.usage.prompt_tokens,
                                                                     chat.usage.completion_tokens)
    # Cut by max_output_tokens, the stream ends with `response.incomplete`, as OpenAI's does (the SDK's
    # `get_final_response` waits for `response.completed` only).
    events = list(openai_client.responses.create(model=model, input=QUESTION, max_output_tokens=12, temperature=0,
                                                 stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert events[-1].type == f"response.{whole.status}"
    assert deltas == final.output_text == whole.output_text and final.usage == whole.usage


def test_text_format_json_schema_on_an_adapter(openai_client, adapter_names):
    schema = {"type": "object", "properties": {"sea": {"type": "string", "maxLength": 20}}, "required": ["sea"],
              "additionalProperties": False}
    response = openai_client.responses.create(
        model=adapter_names[2], input=QUESTION, max_output_tokens=64, temperature=0,
        text={"format": {"type": "json_schema", "name": "sea", "schema": schema, "strict": True}})
    assert response.status == "completed" and set(json.loads(response.output_text)) == {"sea"}


def test_stored_responses_are_their_tenants_and_each_call_is_billed_once(server, keys, base_model_id):
    acme, globex = _sdk(server, keys, "acme"), _sdk(server, keys, "globex")
    request_id = f"resp-{time.time_ns()}"
    first = acme.responses.create(model=base_model_id, input="Hello", max_output_tokens=4,
                                  extra_headers={"X-Request-Id": request_id})
    second = acme.responses.create(model=base_model_id, input="And then?", previous_response_id=first.id,
                                   max_output_tokens=4)
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert acme.responses.retrieve(first.id).output_text == first.output_text
    with pytest.raises(openai.NotFoundError):
        globex.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        globex.responses.create(model=base_model_id, input="x", previous_response_id=first.id)
    with pytest.raises(openai.NotFoundError):
        globex.responses.delete(first.id)
    rows = ledger_rows(server, keys, request_id)
    assert [(r["tenant"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == \
           [("acme", first.usage.input_tokens, first.usage.output_tokens)]
