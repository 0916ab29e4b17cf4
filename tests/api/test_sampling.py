from __future__ import annotations

import pytest

from api.errors import OpenAIError
from api.protocol import CompletionRequest
from api.sampling import build_sampling_params, resolve_max_tokens


@pytest.mark.parametrize("prompt_len,requested,max_len,expected", [
    (10, None, 100, 90),
    (10, 90, 100, 90),
    (10, 1, 100, 1),
    (99, None, 100, 1),
])
def test_resolve_max_tokens(prompt_len, requested, max_len, expected):
    assert resolve_max_tokens(prompt_len, requested, max_len, "prompt") == expected


@pytest.mark.parametrize("prompt_len,requested,max_len,param,code", [
    (10, 91, 100, "max_tokens", "context_length_exceeded"),
    (100, None, 100, "prompt", "context_length_exceeded"),
    (150, 1, 100, "prompt", "context_length_exceeded"),
    (0, 5, 100, "prompt", "invalid_value"),
])
def test_resolve_max_tokens_errors(prompt_len, requested, max_len, param, code):
    with pytest.raises(OpenAIError) as info:
        resolve_max_tokens(prompt_len, requested, max_len, "prompt")
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)


def _req(**kw) -> CompletionRequest:
    return CompletionRequest(model="m", prompt="x", **kw)


@pytest.mark.parametrize("fields,expected", [
    ({}, {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "n": 1, "stop": [], "seed": None}),
    ({"temperature": 0, "seed": 3, "stop": "END"}, {"temperature": 0.0, "seed": 3, "stop": ["END"]}),
    ({"top_k": 40, "repetition_penalty": 1.2, "min_tokens": 2, "ignore_eos": True},
     {"top_k": 40, "repetition_penalty": 1.2, "min_tokens": 2, "ignore_eos": True}),
    ({"presence_penalty": 0.5, "frequency_penalty": -0.5, "n": 3},
     {"presence_penalty": 0.5, "frequency_penalty": -0.5, "n": 3}),
])
def test_build_sampling_params(fields, expected):
    params = build_sampling_params(_req(**fields), max_tokens=8, num_logprobs=None)
    assert params.max_tokens == 8
    for name, value in expected.items():
        assert getattr(params, name) == value, name


def test_min_tokens_above_max_tokens_is_400():
    with pytest.raises(OpenAIError) as info:
        build_sampling_params(_req(min_tokens=9), max_tokens=8, num_logprobs=None)
    assert info.value.param == "min_tokens"
