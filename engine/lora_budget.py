"""How many adapters the engine holds when `max_loras` / `max_cpu_loras` are not given: as many as fit in a memory
budget, counted at `max_lora_rank` in the serving dtype.

vLLM preallocates every engine slot at `max_lora_rank` for every LoRA-capable projection of every layer (A as
[slots, rank, in], B as [slots, out, rank]), whatever the adapters target, so a slot's size is known from the
checkpoint alone. The engine's CPU cache holds adapters at their own rank; counting them at `max_lora_rank` too
makes its budget an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.base_model import BaseModelSpec
from engine.dtype import BF16_CPU_FLAGS

# Caps: 16 slots serve Zipf(1.1) over 64 adapters at concurrency 8 at TTFT p99 1.7x the base model (docs/benchmarks.md,
# `defaults`), and every slot is repacked into the native kernel's layout whenever an adapter enters one
# (engine/worker/native_ops.py), so slots cost time as well as memory.
MAX_AUTO_LORAS = 16
MAX_AUTO_CPU_LORAS = 256
GIB = 2**30


@dataclass(frozen=True)
class LoraSizes:
    max_loras: int
    max_cpu_loras: int


def slot_bytes(spec: BaseModelSpec, rank: int, dtype_bytes: int) -> int:
    """Bytes of one engine slot: A and B of every projection of every layer at `rank`."""
    per_layer = sum(shape.in_features + shape.out_features for shape in spec.modules.values())
    return rank * per_layer * spec.num_hidden_layers * dtype_bytes


def dtype_bytes(dtype: str, cpu_flags: frozenset[str]) -> int:
    """Bytes per element the slots are allocated in. `auto` counts bfloat16 where the CPU computes it natively (what
    `auto` serves on CPU, engine/dtype.py), else float32, the most it can be."""
    if dtype == "auto":
        return 2 if cpu_flags & BF16_CPU_FLAGS else 4
    return 4 if dtype == "float32" else 2


def size_loras(one_slot: int, slots_gib: float, cpu_gib: float, max_loras: int | None,
               max_cpu_loras: int | None) -> LoraSizes:
    """Given values are kept; a missing one is what its budget holds, at most MAX_AUTO_LORAS / MAX_AUTO_CPU_LORAS,
    and at least 1 slot; slots never outnumber a given CPU cache, nor a sized one the slots."""
    if max_loras is None:
        max_loras = min(MAX_AUTO_LORAS, max(1, int(slots_gib * GIB // one_slot)))
        if max_cpu_loras is not None:
            max_loras = min(max_loras, max_cpu_loras)
    if max_cpu_loras is None:
        max_cpu_loras = max(max_loras, min(MAX_AUTO_CPU_LORAS, int(cpu_gib * GIB // one_slot)))
    return LoraSizes(max_loras, max_cpu_loras)
