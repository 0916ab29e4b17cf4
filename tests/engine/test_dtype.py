from __future__ import annotations

import pytest

from engine.dtype import cpu_flags, resolve_dtype

AVX512_BF16 = frozenset({"avx512f", "avx512_bf16"})
AMX = frozenset({"avx512f", "amx_tile", "amx_bf16"})
AVX2 = frozenset({"avx2", "fma"})
ARM_BF16 = frozenset({"asimd", "bf16"})


@pytest.mark.parametrize("requested,on_cpu,flags,expected", [
    ("auto", True, AVX512_BF16, "bfloat16"),
    ("auto", True, AMX, "bfloat16"),
    ("auto", True, ARM_BF16, "bfloat16"),
    ("auto", True, AVX2, "float32"),
    ("auto", True, frozenset(), "float32"),
    ("auto", False, AVX2, "auto"),
    ("float32", True, AMX, "float32"),
    ("bfloat16", True, AVX2, "bfloat16"),
    ("float16", False, frozenset(), "float16"),
])
def test_resolve_dtype(requested, on_cpu, flags, expected):
    assert resolve_dtype(requested, on_cpu=on_cpu, flags=flags) == expected


@pytest.mark.parametrize("text,expected", [
    ("processor\t: 0\nflags\t\t: fpu avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n", {"fpu", "avx512_bf16"}),
    ("processor\t: 0\nFeatures\t: fp asimd bf16\n", {"fp", "asimd", "bf16"}),
    ("processor\t: 0\n", set()),
])
def test_cpu_flags_reads_the_first_processor(tmp_path, text, expected):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    assert cpu_flags(path) == expected


def test_cpu_flags_without_cpuinfo_is_empty(tmp_path):
    assert cpu_flags(tmp_path / "absent") == frozenset()
