from __future__ import annotations

from pathlib import Path
from typing import get_type_hints

import pytest
from openai.types.responses import response_create_params

from api.openai.parameters import markdown_table, unsupported_fields
from api.responses.parameters import RESPONSES
from api.responses.protocol import ResponsesRequest

DOC = Path(__file__).resolve().parents[3] / "docs" / "parameters.md"
# The streaming variant adds `stream`, which the base type leaves out.
SDK_PARAMETERS = set(get_type_hints(response_create_params.ResponseCreateParamsBase)) | {"stream"}


def test_every_sdk_parameter_is_classified():
    """A parameter a newer `openai` SDK adds fails here until it is honoured, refused or listed as a no-op."""
    assert not SDK_PARAMETERS - set(ResponsesRequest.model_fields) - RESPONSES.no_ops.keys() - RESPONSES.refused.keys()


def test_the_honoured_ones_are_the_protocol_fields_and_every_row_is_an_sdk_parameter():
    assert set(ResponsesRequest.model_fields) == RESPONSES.honoured.keys()
    rows = [set(RESPONSES.honoured), set(RESPONSES.no_ops), set(RESPONSES.refused)]
    assert set().union(*rows) <= SDK_PARAMETERS and sum(map(len, rows)) == len(set().union(*rows))


def test_docs_hold_the_table():
    assert markdown_table(RESPONSES) in DOC.read_text()


@pytest.mark.parametrize("extra,refused", [
    ({"service_tier": "auto", "prompt_cache_key": "k", "safety_identifier": "s"}, []),
    ({"truncation": "disabled", "include": [], "background": False, "reasoning": None}, []),
    ({"truncation": "auto", "include": ["reasoning.encrypted_content"]}, ["include", "truncation"]),
    ({"conversation": "conv_1", "new_field": 1}, ["conversation", "new_field"]),
])
def test_unsupported_fields(extra, refused):
    req = ResponsesRequest.model_validate({"model": "m", "input": "x", **extra})
    assert unsupported_fields(req, RESPONSES) == refused
