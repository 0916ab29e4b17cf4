from __future__ import annotations

import pytest

from api.errors import OpenAIError
from api.openai.protocol import CompletionRequest
from api.openai.sampling import build_sampling_params


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
