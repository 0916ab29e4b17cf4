"""Grouped LoRA shrink and expand: one matmul per distinct adapter of the batch (torch, no vLLM)."""

from __future__ import annotations

import torch

from engine.worker.batch_plan import BatchPlan, slot_weights


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
