"""How one engine step's tokens meet their adapter slots: pure batch-planning maths (torch, no vLLM).

The batch's tokens are grouped by adapter slot once per engine step (Punica / S-LoRA's segmented gather
matmul); tokens without an adapter (slot -1) belong to no group, so vllm#48421's leak cannot happen here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


@dataclass(frozen=True)
class Segments:
    """Tokens with an adapter in slot order, for the native kernel: `order[starts[g]:starts[g + 1]]` are the
    token rows of slot `slots[g]`."""

    order: torch.Tensor  # [tokens with an adapter] int64
    starts: torch.Tensor  # [groups + 1] int64
    slots: torch.Tensor  # [groups] int64


def segments(indices: torch.Tensor) -> Segments:
    """Pure; called once per step. A stable sort keeps each slot's tokens in batch order."""
    with_adapter = (indices >= 0).nonzero().squeeze(1)
    slot_of = indices.index_select(0, with_adapter).long()
    sorted_slots, perm = torch.sort(slot_of, stable=True)
    slots, counts = torch.unique_consecutive(sorted_slots, return_counts=True)
    starts = torch.zeros(len(counts) + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=starts[1:])
    return Segments(with_adapter.index_select(0, perm).contiguous(), starts, slots.contiguous())
