from __future__ import annotations

import pytest

from api.errors import OpenAIError
from api.generation.budget import OutputLimit, output_budget

MC = "max_completion_tokens"


@pytest.mark.parametrize(("prompt_len", "limit", "cap", "max_len", "expected"), [
    (10, OutputLimit(None), None, 100, 90),  # no limit: what the context leaves
    (10, OutputLimit(90), None, 100, 90),
    (10, OutputLimit(1), None, 100, 1),
    (99, OutputLimit(None), None, 100, 1),
    (10, OutputLimit(None), 16, 100, 16),  # no limit: the tenant's cap when the context leaves more
    (95, OutputLimit(None), 16, 100, 5),  # ... and the context when it leaves less than the cap
    (10, OutputLimit(16), 16, 100, 16),
    (10, OutputLimit(8, MC), 16, 100, 8),
])
def test_output_budget(prompt_len, limit, cap, max_len, expected):
    assert output_budget(prompt_len, limit, cap, max_len, "prompt") == expected


@pytest.mark.parametrize(("prompt_len", "limit", "cap", "max_len", "param", "code"), [
    (10, OutputLimit(91), None, 100, "max_tokens", "context_length_exceeded"),
    (10, OutputLimit(91, MC), None, 100, MC, "context_length_exceeded"),
    (100, OutputLimit(None), None, 100, "prompt", "context_length_exceeded"),
    (150, OutputLimit(1), None, 100, "prompt", "context_length_exceeded"),
    (0, OutputLimit(5), None, 100, "prompt", "invalid_value"),
    (10, OutputLimit(17), 16, 100, "max_tokens", "invalid_value"),  # above the tenant's cap
    (10, OutputLimit(17, MC), 16, 100, MC, "invalid_value"),
    (150, OutputLimit(17), 16, 100, "max_tokens", "invalid_value"),  # the cap is judged first
])
def test_output_budget_errors(prompt_len, limit, cap, max_len, param, code):
    with pytest.raises(OpenAIError) as info:
        output_budget(prompt_len, limit, cap, max_len, "prompt")
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)


def test_above_the_cap_names_both_numbers():
    with pytest.raises(OpenAIError, match="max_tokens is 513, above this tenant's limit of 512"):
        output_budget(10, OutputLimit(513), 512, 1024, "prompt")
