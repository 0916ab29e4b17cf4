from __future__ import annotations

import pytest

from api.errors import OpenAIError
from api.openai.protocol import CompletionRequest
from api.openai.sampling import build_sampling_params

VOCAB = 100


def _req(**kw) -> CompletionRequest:
    return CompletionRequest(model="m", prompt="x", **kw)


@pytest.mark.parametrize("fields,expected", [
    ({}, {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "n": 1, "stop": [], "seed": None}),
    ({"temperature": 0, "seed": 3, "stop": "END"}, {"temperature": 0.0, "seed": 3, "stop": ["END"]}),
    ({"top_k": 40, "repetition_penalty": 1.2, "min_tokens": 2, "ignore_eos": True},
     {"top_k": 40, "repetition_penalty": 1.2, "min_tokens": 2, "ignore_eos": True}),
    ({"presence_penalty": 0.5, "frequency_penalty": -0.5, "n": 3},
     {"presence_penalty": 0.5, "frequency_penalty": -0.5, "n": 3}),
    ({"min_p": 0.2, "stop_token_ids": [5, 9], "logit_bias": {"7": -100, "99": 2.5}},
     {"min_p": 0.2, "stop_token_ids": [5, 9], "logit_bias": {7: -100.0, 99: 2.5}}),
])
def test_build_sampling_params(fields, expected):
    params = build_sampling_params(_req(**fields), max_tokens=8, num_logprobs=None, vocab_size=VOCAB)
    assert params.max_tokens == 8
    for name, value in expected.items():
        assert getattr(params, name) == value, name


def test_min_tokens_above_max_tokens_is_400():
    with pytest.raises(OpenAIError) as info:
        build_sampling_params(_req(min_tokens=9), max_tokens=8, num_logprobs=None, vocab_size=VOCAB)
    assert info.value.param == "min_tokens"


@pytest.mark.parametrize("fields,param", [
    ({"logit_bias": {"100": 1}}, "logit_bias"),
    ({"logit_bias": {"hello": 1}}, "logit_bias"),
    ({"logit_bias": {"-3": 1}}, "logit_bias"),
    ({"stop_token_ids": [100]}, "stop_token_ids"),
])
def test_token_ids_outside_the_vocabulary_are_400(fields, param):
    with pytest.raises(OpenAIError) as info:
        build_sampling_params(_req(**fields), max_tokens=8, num_logprobs=None, vocab_size=VOCAB)
    assert (info.value.status, info.value.param) == (400, param)
