"""Grouped multi-LoRA ops for vLLM's CPU path.

vLLM-CPU's torch LoRA ops gather one full adapter matrix per token (`lora_b_weights[token_indices]`) and
run a batched einsum, so cost grows with tokens x matrix size. Here the batch's tokens are grouped by
adapter slot once per engine step (Punica / S-LoRA's segmented gather matmul): one matmul per distinct
adapter and module, tokens without an adapter are skipped (so vllm#48421's leak cannot happen), and a
batch without adapters does no LoRA work at all.

`add_shrink` / `add_expand` (and so `add_lora_linear`) and `add_lora_logits` change; when the
intermediate buffer is one tensor (every vLLM caller on this path) they run `engine.lora_fused`'s one
batched matmul per module. Embedding and full-linear LoRA keep vLLM's ops, which `engine.lora_isolation`
guards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from vllm.logger import init_logger

# Under vLLM's logger namespace: these modules run inside vLLM's engine-core and worker processes, where
# only vLLM's loggers have handlers.
logger = init_logger(f"vllm.loraplex.{__name__}")

ENV_SWITCH = "LORAPLEX_LORA_KERNELS"  # "grouped" (default) or "stock"
# vLLM releases whose PunicaWrapperCPU contract (token_lora_indices, add_shrink/add_expand semantics,
# stacked weight layout [slots, 1, out, in]) these ops were checked against.
VERIFIED_VLLM_VERSIONS = frozenset({"0.32.0"})


@dataclass(frozen=True)
class TokenGroup:
    """Tokens of one adapter slot: `rows` is a slice when they are contiguous, else an index tensor."""

    slot: int
    rows: slice | torch.Tensor


def token_groups(indices: torch.Tensor) -> tuple[TokenGroup, ...]:
    """Groups token positions by slot index, skipping -1 (no adapter). Pure; called once per step."""
    if indices.numel() == 0:
        return ()
    slots = torch.unique(indices)
    groups = []
    for slot in slots.tolist():
        if slot < 0:
            continue
        if len(slots) == 1:
            groups.append(TokenGroup(slot, slice(0, indices.numel())))
            continue
        rows = (indices == slot).nonzero().squeeze(1)
        first, last = int(rows[0]), int(rows[-1])
        if last - first + 1 == rows.numel():
            groups.append(TokenGroup(slot, slice(first, last + 1)))
        else:
            groups.append(TokenGroup(slot, rows))
    return tuple(groups)


@dataclass(frozen=True)
class PaddedGroups:
    """Scattered groups laid out as [groups, max_len] blocks for one batched matmul per module.

    Padding positions repeat a real token row; their results are computed and discarded.
    """

    slots: torch.Tensor | slice  # a slice when the slots are consecutive: a weight view, no copy
    num_groups: int
    max_len: int
    pad_rows: torch.Tensor  # [num_groups * max_len] token row read at each padded position
    valid: torch.Tensor  # [n] padded positions that hold a real token
    rows: torch.Tensor  # [n] that token's row


@dataclass(frozen=True)
class BatchPlan:
    """How one engine step's tokens meet their adapters; computed once, used by every LoRA module."""

    groups: tuple[TokenGroup, ...]
    padded: PaddedGroups | None  # None when there are no groups
    contiguous: bool = True  # every group is one run of tokens: per-group slices need no gather


def plan_batch(indices: torch.Tensor) -> BatchPlan:
    groups = token_groups(indices)
    if not groups:
        return BatchPlan(groups, None)
    slot_list = [g.slot for g in groups]
    members = [torch.arange(g.rows.start, g.rows.stop) if isinstance(g.rows, slice) else g.rows for g in groups]
    max_len = max(len(m) for m in members)
    pad_rows = torch.cat([torch.cat([m, m[:1].expand(max_len - len(m))]) for m in members])
    valid = torch.cat([i * max_len + torch.arange(len(m)) for i, m in enumerate(members)])
    consecutive = slot_list == list(range(slot_list[0], slot_list[0] + len(slot_list)))
    slots = slice(slot_list[0], slot_list[-1] + 1) if consecutive else torch.tensor(slot_list)
    padded = PaddedGroups(slots=slots, num_groups=len(groups), max_len=max_len, pad_rows=pad_rows, valid=valid,
                          rows=torch.cat(members))
    return BatchPlan(groups, padded, contiguous=all(isinstance(g.rows, slice) for g in groups))


def slot_weights(stacked: torch.Tensor, slots: torch.Tensor | slice) -> torch.Tensor:
    """[groups, out, in] weights of the given slots from [slots, 1, out, in]."""
    chosen = stacked[slots] if isinstance(slots, slice) else stacked.index_select(0, slots)
    return chosen[:, 0]


def grouped_shrink(out: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, plan: BatchPlan, scale: float) -> None:
    """out[rows] = scale * x[rows] @ A[slot]^T per group; rows without an adapter are left alone.

    out: [tokens, rank] (float32 buffer), x: [tokens, hidden], lora_a: [slots, 1, rank, hidden].
    """
    rank = lora_a.shape[2]
    if plan.contiguous:
        for g in plan.groups:
            out[g.rows, :rank] = (x[g.rows].to(out.dtype) @ lora_a[g.slot, 0].to(out.dtype).T) * scale
        return
    p = plan.padded
    blocks = x.index_select(0, p.pad_rows).to(out.dtype).view(p.num_groups, p.max_len, -1)
    h = torch.bmm(blocks, slot_weights(lora_a, p.slots).to(out.dtype).transpose(1, 2))  # [G, L, rank]
    h.mul_(scale)
    out[:, :rank].index_copy_(0, p.rows, h.view(-1, rank).index_select(0, p.valid))


def grouped_expand(out: torch.Tensor, x: torch.Tensor, lora_b: torch.Tensor, plan: BatchPlan, offset: int,
                   size: int, add_inputs: bool) -> None:
    """out[rows, offset:offset+size] (+)= x[rows] @ B[slot]^T per group.

    out: [tokens, total_out], x: [tokens, rank], lora_b: [slots, 1, >= size, rank] (rows past `size` are
    padding, as for a vocabulary padded differently from the logits).
    """
    columns = out[:, offset: offset + size]
    if plan.contiguous:
        for g in plan.groups:
            delta = x[g.rows].to(out.dtype) @ lora_b[g.slot, 0, :size].to(out.dtype).T
            if add_inputs:
                columns[g.rows] += delta
            else:
                columns[g.rows] = delta
        return
    p = plan.padded
    blocks = x.index_select(0, p.pad_rows).to(out.dtype).view(p.num_groups, p.max_len, -1)
    weights = slot_weights(lora_b, p.slots)[:, :size].to(out.dtype)
    delta = torch.bmm(blocks, weights.transpose(1, 2)).view(-1, size).index_select(0, p.valid)  # [n, size]
    if add_inputs:
        columns.index_add_(0, p.rows, delta)
    else:
        columns.index_copy_(0, p.rows, delta)


def make_grouped_wrapper(base: type) -> type:
    """A subclass of vLLM's PunicaWrapperCPU whose linear LoRA ops are grouped by adapter."""

    from engine.lora_fused import FusedWeightCache, fused_expand, fused_shrink

    class GroupedPunicaWrapperCPU(base):
        _plan: BatchPlan = BatchPlan((), None)
        _num_tokens: int = 0
        _sampler_plan: BatchPlan = BatchPlan((), None)

        def update_metadata(self, *args, **kwargs):
            super().update_metadata(*args, **kwargs)
            indices = self.token_lora_indices
            self._num_tokens = indices.numel()
            self._plan = plan_batch(indices)
            self._sampler_plan = plan_batch(self.sampler_indices)

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
            """Without adapters in the batch, not even the intermediate buffers are allocated."""
            if not self._plan.groups:
                return
            if buffer is None:
                # Zeroed: the fused ops skip the rank columns no adapter uses (engine.lora_fused).
                shape = (len(output_slices), x.view(-1, x.shape[-1]).shape[0], lora_b_stacked[0].shape[-1])
                buffer = torch.zeros(shape, dtype=torch.float32)
            self.add_shrink(buffer, x, lora_a_stacked, scale)
            self.add_expand(y, buffer, lora_b_stacked, output_slices, add_inputs=True)

        def add_lora_logits(self, y, x, lora_a_stacked, lora_b_stacked, scale, *, buffer=None, **kwargs):
            """Per sequence (sampler indices), not per token; a batch without adapters, or adapters that do
            not target lm_head, does nothing."""
            if not self._sampler_plan.groups:
                return
            flat_y, flat_x = y.view(-1, y.shape[-1]), x.view(-1, x.shape[-1])
            buffer = torch.zeros((1, flat_x.shape[0], lora_b_stacked.shape[-1]), dtype=torch.float32)
            padded, cache = self._sampler_plan.padded, self._fused_cache()
            fused_shrink(buffer, flat_x, (lora_a_stacked,), padded, scale, cache)
            size = min(lora_b_stacked.shape[2], flat_y.shape[1])
            fused_expand(flat_y, buffer, (lora_b_stacked,), (size,), 0, padded, True, cache)

    GroupedPunicaWrapperCPU.__qualname__ = "GroupedPunicaWrapperCPU"
    return GroupedPunicaWrapperCPU


def wanted() -> bool:
    choice = os.environ.get(ENV_SWITCH, "grouped").lower()
    if choice not in ("grouped", "stock"):
        raise ValueError(f"{ENV_SWITCH} must be 'grouped' or 'stock', got {choice!r}")
    return choice == "grouped"


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
    # The platform names its wrapper by qualname; vLLM resolves it through this module attribute.
    punica_cpu.PunicaWrapperCPU = make_grouped_wrapper(current)
    logger.info("loraplex: grouped LoRA ops installed for the CPU punica wrapper")
    return True
