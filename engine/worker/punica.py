"""vLLM's CPU punica wrapper with grouped multi-LoRA ops, and its installation.

vLLM-CPU's torch LoRA ops gather one full adapter matrix per token (`lora_b_weights[token_indices]`) and
run a batched einsum, so cost grows with tokens x matrix size. Here the batch is planned once per engine
step (`engine.worker.batch_plan`): one matmul per distinct adapter and module, tokens without an adapter
are skipped (so vllm#48421's leak cannot happen), and a batch without adapters does no LoRA work at all.

`add_lora_embedding` is grouped too, and skipped when no adapter targets the embeddings.
`add_lora_linear` and `add_lora_logits` run the native kernel (`engine.worker.native_ops`, one C++ call per
module) when it was built at install; otherwise, and for `add_shrink` / `add_expand` called on their own (sharded
layers), the eager grouped ops: with one intermediate buffer tensor (every vLLM caller on this path)
`engine.worker.fused_ops`'s one batched matmul per module. Which one runs is logged at start. Other LoRA ops
keep vLLM's, which `engine.worker.isolation` guards.
"""

from __future__ import annotations

import os

import torch
from vllm.logger import init_logger

from engine.worker import compiled_ops, native_ops
from engine.worker.batch_plan import BatchPlan, Segments, plan_batch, segments
from engine.worker.fused_ops import FusedWeightCache, ZeroWeights, fused_expand, fused_shrink
from engine.worker.grouped_ops import grouped_expand, grouped_shrink
from engine.worker.native_ops import PreparedCache, native_lora_linear

# Under vLLM's logger namespace: these modules run inside vLLM's engine-core and worker processes, where
# only vLLM's loggers have handlers.
logger = init_logger(f"vllm.loraplex.{__name__}")

# "grouped" (default): the native kernel when built, else the eager grouped ops; "native": the native kernel or
# fail; "eager": the eager grouped ops; "stock": vLLM's own ops.
ENV_SWITCH = "LORAPLEX_LORA_KERNELS"
CHOICES = ("grouped", "native", "eager", "stock")
_NATIVE_DTYPES = (torch.float32, torch.bfloat16)
# vLLM releases whose PunicaWrapperCPU contract (token_lora_indices, add_shrink/add_expand semantics,
# stacked weight layout [slots, 1, out, in]) these ops were checked against.
VERIFIED_VLLM_VERSIONS = frozenset({"0.32.0"})


def make_grouped_wrapper(base: type, native: bool = False, compiled: bool = False) -> type:
    """A subclass of vLLM's PunicaWrapperCPU whose linear LoRA ops are grouped by adapter; with `native`,
    `add_lora_linear` and `add_lora_logits` run the native kernel. With `compiled`, the ops a compiled forward
    calls go through loraplex's custom ops (`engine.worker.compiled_ops`), which run the `eager_*` methods."""

    class GroupedPunicaWrapperCPU(base):
        _plan: BatchPlan = BatchPlan((), None)
        _num_tokens: int = 0
        _sampler_plan: BatchPlan = BatchPlan((), None)
        _segments: Segments | None = None
        _sampler_segments: Segments | None = None
        uses_native_kernel = native

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.op_id = compiled_ops.register_wrapper(self)

        def update_metadata(self, *args, **kwargs):
            super().update_metadata(*args, **kwargs)
            self.plan_step(self.token_lora_indices, self.sampler_indices)

        def plan_step(self, token_indices: torch.Tensor, sampler_indices: torch.Tensor) -> None:
            self._num_tokens = token_indices.numel()
            self._plan = plan_batch(token_indices)
            self._sampler_plan = plan_batch(sampler_indices)
            if native:
                self._segments, self._sampler_segments = segments(token_indices), segments(sampler_indices)

        def _prepared_cache(self) -> PreparedCache:
            return self.__dict__.setdefault("_prepared_weights", PreparedCache())

        def _native_fits(self, y: torch.Tensor, x: torch.Tensor) -> bool:
            return (native and y.dtype == x.dtype and y.dtype in _NATIVE_DTYPES and y.stride(-1) == 1
                    and x.stride(-1) == 1)

        def _fused_cache(self) -> FusedWeightCache:
            return self.__dict__.setdefault("_fused_weights", FusedWeightCache())

        def _plan_for(self, x: torch.Tensor) -> BatchPlan:
            if x.shape[0] != self._num_tokens:
                raise RuntimeError(
                    f"grouped LoRA ops: {x.shape[0]} input rows but {self._num_tokens} token indices; "
                    f"set {ENV_SWITCH}=stock to use vLLM's ops"
                )
            return self._plan

        def add_shrink(self, y, x, lora_a_stacked, scale, **kwargs):
            if compiled:
                torch.ops.loraplex.lora_shrink(y, x, list(lora_a_stacked), scale, self.op_id)
            else:
                self.eager_add_shrink(y, x, lora_a_stacked, scale)

        def eager_add_shrink(self, y, x, lora_a_stacked, scale):
            x = x.view(-1, x.shape[-1])
            plan = self._plan_for(x)
            if not plan.groups:
                return
            if plan.padded is not None and isinstance(y, torch.Tensor) and y.dim() == 3:
                fused_shrink(y, x, lora_a_stacked, plan.padded, scale, self._fused_cache())
                return
            for i, lora_a in enumerate(lora_a_stacked):
                grouped_shrink(y[i].view(-1, y[i].shape[-1]), x, lora_a, plan, scale)

        def add_expand(self, y, x, lora_b_stacked, output_slices, offset_start=0, add_inputs=True, **kwargs):
            if compiled:
                torch.ops.loraplex.lora_expand(y, x, list(lora_b_stacked), list(output_slices), offset_start,
                                               add_inputs, self.op_id)
            else:
                self.eager_add_expand(y, x, lora_b_stacked, output_slices, offset_start, add_inputs)

        def eager_add_expand(self, y, x, lora_b_stacked, output_slices, offset_start=0, add_inputs=True):
            flat = y.view(-1, y.shape[-1])
            plan = self._plan_for(flat)
            if not plan.groups:
                return
            if plan.padded is not None and isinstance(x, torch.Tensor) and x.dim() == 3:
                fused_expand(flat, x, lora_b_stacked, output_slices, offset_start, plan.padded, add_inputs,
                             self._fused_cache())
                return
            offset = offset_start
            for i, lora_b in enumerate(lora_b_stacked):
                grouped_expand(flat, x[i], lora_b, plan, offset, output_slices[i], add_inputs)
                offset += output_slices[i]

        def add_lora_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, *, buffer=None,
                            **kwargs):
            """A caller's `buffer` (an intermediate no caller reads back) is not passed to the custom op."""
            if compiled:
                torch.ops.loraplex.lora_linear(y, x, list(lora_a_stacked), list(lora_b_stacked), scale,
                                               list(output_slices), kwargs.get("add_inputs", True), self.op_id)
            else:
                self.eager_add_lora_linear(y, x, lora_a_stacked, lora_b_stacked, scale, output_slices,
                                           buffer=buffer, **kwargs)

        def eager_add_lora_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, *,
                                  buffer=None, **kwargs):
            """Without adapters in the batch, not even the intermediate buffers are allocated."""
            if not self._plan.groups:
                return
            flat_x = x.view(-1, x.shape[-1])
            if self._native_fits(y, flat_x) and y.dim() == 2 and buffer is None:
                self._plan_for(flat_x)
                native_lora_linear(y, flat_x, lora_a_stacked, lora_b_stacked, scale, output_slices, 0,
                                   self._segments, self._prepared_cache(), kwargs.get("add_inputs", True))
                return
            if buffer is None:
                # Zeroed: the fused ops skip the rank columns no adapter uses (engine.worker.fused_ops).
                shape = (len(output_slices), x.view(-1, x.shape[-1]).shape[0], lora_b_stacked[0].shape[-1])
                buffer = torch.zeros(shape, dtype=torch.float32)
            self.eager_add_shrink(buffer, x, lora_a_stacked, scale)
            self.eager_add_expand(y, buffer, lora_b_stacked, output_slices, add_inputs=True)

        def add_lora_embedding(self, y, x, lora_b_stacked, add_inputs=True, **kwargs):
            if compiled:
                torch.ops.loraplex.lora_embedding(y, x, lora_b_stacked, add_inputs, self.op_id)
            else:
                self.eager_add_lora_embedding(y, x, lora_b_stacked, add_inputs)

        def eager_add_lora_embedding(self, y, x, lora_b_stacked, add_inputs=True):
            """Embedding LoRA: nothing when no adapter in the batch targets the embeddings (their stacked B is all
            zero), else one matmul per adapter (x: [tokens, rank] rows of the stacked embedding A)."""
            if not self._plan.groups or self.__dict__.setdefault("_zero", ZeroWeights())(lora_b_stacked):
                return
            flat = y.view(-1, y.shape[-1])
            grouped_expand(flat, x.view(-1, x.shape[-1]), lora_b_stacked, self._plan_for(flat), 0, flat.shape[1],
                           add_inputs)

        def add_lora_logits(self, y, x, lora_a_stacked, lora_b_stacked, scale, *, buffer=None, **kwargs):
            """Per sequence (sampler indices), not per token; a batch without adapters, or adapters that do
            not target lm_head, does nothing."""
            if not self._sampler_plan.groups:
                return
            flat_y, flat_x = y.view(-1, y.shape[-1]), x.view(-1, x.shape[-1])
            size = min(lora_b_stacked.shape[2], flat_y.shape[1])
            if self._native_fits(flat_y, flat_x):
                native_lora_linear(flat_y, flat_x, (lora_a_stacked,), (lora_b_stacked,), scale, (size,), 0,
                                   self._sampler_segments, self._prepared_cache())
                return
            buffer = torch.zeros((1, flat_x.shape[0], lora_b_stacked.shape[-1]), dtype=torch.float32)
            padded, cache = self._sampler_plan.padded, self._fused_cache()
            fused_shrink(buffer, flat_x, (lora_a_stacked,), padded, scale, cache)
            fused_expand(flat_y, buffer, (lora_b_stacked,), (size,), 0, padded, True, cache)

    GroupedPunicaWrapperCPU.__qualname__ = "GroupedPunicaWrapperCPU"
    return GroupedPunicaWrapperCPU


def choice() -> str:
    value = os.environ.get(ENV_SWITCH, "grouped").lower()
    if value not in CHOICES:
        raise ValueError(f"{ENV_SWITCH} must be one of {', '.join(CHOICES)}, got {value!r}")
    return value


def use_native(value: str) -> bool:
    """Whether the grouped wrapper runs the native kernel, for a `choice()` other than stock."""
    if value == "native" and native_ops.KERNEL is None:
        raise RuntimeError(f"{ENV_SWITCH}=native but the native LoRA kernel is not built "
                           f"({native_ops.UNAVAILABLE}); run `make venv` or scripts/build_kernel.py")
    return value in ("grouped", "native") and native_ops.KERNEL is not None


def wanted() -> bool:
    return choice() != "stock"


def install() -> bool:
    """Swap vLLM's CPU punica wrapper for the grouped one; returns whether it did."""
    import vllm
    from vllm.lora.punica_wrapper import punica_cpu

    if not wanted():
        return False
    if vllm.__version__ not in VERIFIED_VLLM_VERSIONS:
        raise RuntimeError(
            f"loraplex's grouped LoRA ops are verified for vLLM {sorted(VERIFIED_VLLM_VERSIONS)}, but "
            f"{vllm.__version__} is installed. Set {ENV_SWITCH}=stock to run vLLM's own ops."
        )
    current = punica_cpu.PunicaWrapperCPU
    if current.__name__ == "GroupedPunicaWrapperCPU":
        return True
    native, compiled = use_native(choice()), compiled_ops.wanted()
    if compiled:
        compiled_ops.register_ops()
    # The platform names its wrapper by qualname; vLLM resolves it through this module attribute.
    punica_cpu.PunicaWrapperCPU = make_grouped_wrapper(current, native, compiled)
    if compiled:
        compiled_ops.lift_eager_rule()
    if native:
        logger.info("loraplex: grouped LoRA ops installed for the CPU punica wrapper, native kernel "
                    "(engine/worker/csrc/lora_kernel.cpp)")
    else:
        reason = "set to eager" if choice() == "eager" else f"native kernel unavailable: {native_ops.UNAVAILABLE}"
        logger.info("loraplex: grouped LoRA ops installed for the CPU punica wrapper, eager torch ops (%s)", reason)
    return True
