from __future__ import annotations

from pathlib import Path
from typing import get_type_hints

import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params

from api.errors import OpenAIError
from api.openai.parameters import HONOURED, NO_OPS, REFUSED, markdown_table, refuse_unsupported, unsupported_fields
from api.openai.protocol import ChatCompletionRequest, CompletionRequest

DOC = Path(__file__).resolve().parents[3] / "docs" / "parameters.md"
MSG = [{"role": "user", "content": "x"}]
# vLLM extensions: honoured fields that no OpenAI SDK type lists.
VLLM_EXTENSIONS = {"ignore_eos", "min_tokens", "top_k", "min_p", "repetition_penalty", "stop_token_ids",
                   "return_token_ids", "structured_outputs", "chat_template_kwargs", "response_format"}


def _sdk_parameters(params) -> set[str]:
    # The streaming variant adds `stream`, which the base type leaves out.
    return set(get_type_hints(params.CompletionCreateParamsBase)) | {"stream"}


@pytest.mark.parametrize("request_cls,sdk", [(ChatCompletionRequest, chat_create_params),
                                             (CompletionRequest, completion_create_params)])
def test_every_sdk_parameter_is_classified(request_cls, sdk):
    """A parameter a newer `openai` SDK adds fails here until it is honoured, refused or listed as a no-op."""
    unclassified = _sdk_parameters(sdk) - set(request_cls.model_fields) - NO_OPS.keys() - REFUSED.keys()
    assert not unclassified


@pytest.mark.parametrize("request_cls", [ChatCompletionRequest, CompletionRequest])
def test_every_honoured_field_is_a_protocol_field_and_documented(request_cls):
    assert set(request_cls.model_fields) <= HONOURED.keys()


def test_every_documented_parameter_is_known_to_an_sdk_or_vllm():
    known = _sdk_parameters(chat_create_params) | _sdk_parameters(completion_create_params) | VLLM_EXTENSIONS
    assert set(HONOURED) | set(NO_OPS) | set(REFUSED) <= known


def test_no_parameter_is_in_two_classes():
    assert not (HONOURED.keys() & NO_OPS.keys() or HONOURED.keys() & REFUSED.keys() or NO_OPS.keys() & REFUSED.keys())


def test_docs_hold_the_table():
    assert markdown_table() in DOC.read_text()


@pytest.mark.parametrize("extra,refused", [
    ({}, []),
    ({"metadata": {"a": "b"}, "service_tier": "auto"}, []),
    ({"tools": None, "store": False, "parallel_tool_calls": False, "tools_": None}, []),
    ({"tools": []}, []),
    ({"functions": [{"name": "f"}], "store": True}, ["functions", "store"]),
    ({"suffix": "x"}, ["suffix"]),
    ({"brand_new_field": 1}, ["brand_new_field"]),
    ({"messages": [{"role": "assistant", "content": "x", "tool_calls": None, "refusal": None, "annotations": []}]},
     []),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "refusal": "no"}]},
     ["messages[1].refusal"]),
])
def test_unsupported_fields(extra, refused):
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **extra})
    assert unsupported_fields(req) == refused


def test_refusal_names_every_field_with_its_reason():
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "suffix": "y", "store": True, "zz": 1})
    with pytest.raises(OpenAIError) as info:
        refuse_unsupported(req)
    e = info.value
    assert (e.status, e.code, e.param) == (400, "unsupported_parameter", "store")
    assert "suffix: no model served here has a fill-in-the-middle template" in e.message
    assert "zz: not a parameter of this endpoint" in e.message
