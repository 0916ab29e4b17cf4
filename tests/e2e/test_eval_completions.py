"""What an evaluation harness sends to score answers by log-likelihood (`/v1/completions` with `echo`, `logprobs`
and `max_tokens` 0), on the real engine: the prompt's log-probabilities equal transformers + peft's in float32,
for the base model and each adapter."""

from __future__ import annotations

import math

import pytest

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.mark.parametrize("model_index", [None, 0, 1, 2])
def test_prompt_logprobs_equal_hf(openai_client, hf_reference, tokenizer, base_model_id, adapter_names, model_index):
    adapter = None if model_index is None else adapter_names[model_index]
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    response = openai_client.completions.create(model=adapter or base_model_id, prompt=ids, echo=True, logprobs=1,
                                                max_tokens=0, temperature=0)
    choice = response.choices[0]
    assert choice.text == tokenizer.decode(ids)
    assert response.usage.completion_tokens == 0
    served = choice.logprobs.token_logprobs
    assert served[0] is None and len(served) == len(ids)
    expected = hf_reference.prompt_logprobs(adapter, ids)
    assert all(math.isclose(s, e, rel_tol=1e-4, abs_tol=1e-4) for s, e in zip(served[1:], expected)), \
        list(zip(served[1:], expected))
    # The top alternative at each position is at least as likely as the prompt's own token.
    assert all(max(top.values()) >= lp - 1e-6 for top, lp in zip(choice.logprobs.top_logprobs[1:], served[1:]))


def test_echo_with_output_continues_after_the_prompt(openai_client, adapter_names, tokenizer):
    free = openai_client.completions.create(model=adapter_names[0], prompt=PROMPT, max_tokens=6, temperature=0,
                                            extra_body={"ignore_eos": True})
    echoed = openai_client.completions.create(model=adapter_names[0], prompt=PROMPT, max_tokens=6, temperature=0,
                                              echo=True, logprobs=0, extra_body={"ignore_eos": True})
    choice = echoed.choices[0]
    assert choice.text == PROMPT + free.choices[0].text
    assert len(choice.logprobs.tokens) == len(tokenizer.encode(PROMPT, add_special_tokens=False)) + 6
    assert echoed.usage.completion_tokens == 6
