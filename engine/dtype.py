"""What `--dtype auto` serves: bfloat16 where the CPU computes it natively, float32 where it does not; on other
platforms, vLLM's own choice (the checkpoint's dtype, float32 checkpoints downcast)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

Dtype = Literal["auto", "float32", "bfloat16", "float16"]

# x86: AVX512-BF16 or AMX; aarch64: FEAT_BF16 (`bf16` in /proc/cpuinfo's Features).
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags (`flags` on x86, `Features` on aarch64); empty where there is no cpuinfo."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def resolve_dtype(requested: Dtype, *, on_cpu: bool, flags: frozenset[str]) -> str:
    """The dtype vLLM is started with. vLLM's own `auto` on CPU picks bfloat16 on every x86 CPU, even one that
    emulates it; float32 there is faster and exact."""
    if requested != "auto" or not on_cpu:
        return requested
    return "bfloat16" if flags & BF16_CPU_FLAGS else "float32"
