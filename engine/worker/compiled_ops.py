"""LoRA in vLLM's compiled CPU graph: loraplex's LoRA ops as torch custom ops, and the platform rule lifted.

vLLM's CPU platform compiles the model (dynamo, traced once, then inductor) except when LoRA is enabled: then
every step runs eagerly (`CpuPlatform.check_and_update_config`, "lora_config is not None -> mode NONE"), about
0.6x of a compiled engine before any adapter is in the batch. The reason is the punica wrapper: its ops branch on
per-step Python state (the batch's adapter groups), which a graph traced once would freeze at its first step.

Here the wrapper's in-graph entry points (`add_lora_linear`, `add_lora_embedding`, and `add_shrink` /
`add_expand` of sharded layers) each become one opaque custom op (`torch.ops.loraplex.*`, fake implementations
for tracing) that mutates its output in place. The graph holds only the call; the per-step plan (token to slot,
groups, segments) is made outside it by `update_metadata`, and the op reads it from its wrapper at run time, so
one compiled graph serves every mix of adapters. `add_lora_logits` stays a plain call: vLLM computes logits
outside the compiled forward.

`LORAPLEX_LORA_COMPILE=off` keeps vLLM's rule (eager), as does a run without the grouped ops.
"""

from __future__ import annotations

import os

import torch
from vllm.logger import init_logger

logger = init_logger(f"vllm.loraplex.{__name__}")

ENV_SWITCH = "LORAPLEX_LORA_COMPILE"
LIBRARY = torch.library.Library("loraplex", "FRAGMENT")  # the ops live as long as this object
# Punica wrappers by number, in the order a process makes them (one per model): the ops' way back to the step's
# plan. A number, not id(): it is a constant of the compiled graph, which vLLM may cache for another process.
_wrappers: list[object] = []
_installed = False


def wanted() -> bool:
    value = os.environ.get(ENV_SWITCH, "on").lower()
    if value not in ("on", "off", "1", "0", "true", "false"):
        raise ValueError(f"{ENV_SWITCH} must be on or off, got {value!r}")
    return value in ("on", "1", "true")


def register_wrapper(wrapper: object) -> int:
    _wrappers.append(wrapper)
    return len(_wrappers) - 1


def _lora_linear(y: torch.Tensor, x: torch.Tensor, lora_a: list[torch.Tensor], lora_b: list[torch.Tensor],
                 scale: float, output_slices: list[int], add_inputs: bool, wrapper: int) -> None:
    _wrappers[wrapper].eager_add_lora_linear(y, x, tuple(lora_a), tuple(lora_b), scale, tuple(output_slices),
                                             add_inputs=add_inputs)


def _lora_embedding(y: torch.Tensor, x: torch.Tensor, lora_b: torch.Tensor, add_inputs: bool, wrapper: int) -> None:
    _wrappers[wrapper].eager_add_lora_embedding(y, x, lora_b, add_inputs)


def _lora_shrink(y: torch.Tensor, x: torch.Tensor, lora_a: list[torch.Tensor], scale: float, wrapper: int) -> None:
    _wrappers[wrapper].eager_add_shrink(y, x, tuple(lora_a), scale)


def _lora_expand(y: torch.Tensor, x: torch.Tensor, lora_b: list[torch.Tensor], output_slices: list[int],
                 offset_start: int, add_inputs: bool, wrapper: int) -> None:
    _wrappers[wrapper].eager_add_expand(y, x, tuple(lora_b), tuple(output_slices), offset_start, add_inputs)


def _nothing(*args, **kwargs) -> None:
    """The fake implementation: the ops only write into their first argument."""


_OPS = {"lora_linear": _lora_linear, "lora_embedding": _lora_embedding, "lora_shrink": _lora_shrink,
        "lora_expand": _lora_expand}


def register_ops() -> None:
    """Idempotent: vLLM may load plugins more than once per process."""
    global _installed
    if _installed:
        return
    from vllm.utils.torch_utils import direct_register_custom_op

    for name, impl in _OPS.items():
        direct_register_custom_op(name, impl, mutates_args=["y"], fake_impl=_nothing, target_lib=LIBRARY,
                                  dispatch_key="CPU")
    _installed = True


def lift_eager_rule() -> None:
    """vLLM's CPU platform configures compilation with the LoRA config hidden from it, so a LoRA engine gets the
    compilation a plain one gets. Called only once the ops above are registered and the wrapper uses them."""
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.check_and_update_config.__func__
    if getattr(original, "loraplex", False):
        return

    def check_and_update_config(cls, vllm_config) -> None:
        lora = vllm_config.lora_config
        vllm_config.lora_config = None
        try:
            original(cls, vllm_config)
        finally:
            vllm_config.lora_config = lora
        if lora is not None:
            mode = vllm_config.compilation_config.mode
            logger.info("loraplex: LoRA engine compiled like one without LoRA (compilation mode %s, backend %s; "
                        "LoRA ops are custom ops; %s=off for eager)", getattr(mode, "name", mode),
                        vllm_config.compilation_config.backend, ENV_SWITCH)

    check_and_update_config.loraplex = True
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
