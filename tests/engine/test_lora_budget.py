from __future__ import annotations

import pytest

from engine.lora_budget import dtype_bytes


@pytest.mark.parametrize("dtype,flags,expected", [
    ("auto", frozenset({"avx512f", "avx512_bf16"}), 2),  # what auto serves on such a CPU: bfloat16
    ("auto", frozenset({"amx_bf16"}), 2),
    ("auto", frozenset({"avx512f"}), 4),  # float32 on a CPU without bfloat16, and the most auto can be
    ("auto", frozenset(), 4),
    ("float32", frozenset({"avx512_bf16"}), 4),
    ("bfloat16", frozenset(), 2),
    ("float16", frozenset(), 2),
])
def test_dtype_bytes(dtype, flags, expected):
    assert dtype_bytes(dtype, flags) == expected
