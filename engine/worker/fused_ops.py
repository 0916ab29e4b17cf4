"""One batched matmul per LoRA module instead of one per slice, for batches whose adapters interleave.

A module with several slices (q/k/v, gate/up) shares its input, so the A matrices of every slice are
concatenated per slot, and the B matrices laid out block-diagonally, into weights cached per (module, slots).
A cached entry is reused only while the stacked tensors are unchanged: vLLM writes adapter weights into
them in place, which bumps their version counters, and the counters are part of the check.

Stacked weights are zero-padded to `max_lora_rank`; the cached weights keep only the ranks the batch's
adapters use (rows of A / columns of B that are not all zero), so rank-16 adapters on a rank-64 engine cost
rank-16 matmuls. This needs the caller's intermediate buffer zero-initialised, as vLLM's callers do: the
skipped rank columns are exactly zero.
"""

from __future__ import annotations

import torch

from engine.worker.batch_plan import PaddedGroups, slot_weights


class FusedWeightCache:
    """Concatenated A and block-diagonal B weights of the slots a batch uses, per LoRA module."""

    def __init__(self, max_entries: int = 512):
        self._entries: dict[tuple, tuple[tuple, torch.Tensor]] = {}
        self._max_entries = max_entries

    def get(self, stacked: tuple[torch.Tensor, ...], slots, kind: str, build) -> torch.Tensor:
        # A slice's (start, stop) must not read as a list of two slots: slice(0, 3) is slots 0, 1, 2; [0, 3] is two.
        slot_key = ("range", slots.start, slots.stop) if isinstance(slots, slice) else ("slots", *slots.tolist())
        key = (kind, stacked[0].data_ptr(), slot_key)
        try:
            versions = tuple((t.data_ptr(), t._version) for t in stacked)
        except RuntimeError:  # inference-mode tensors keep no version counter: never cache them
            return build()
        hit = self._entries.get(key)
        if hit is not None and hit[0] == versions:
            return hit[1]
        if len(self._entries) >= self._max_entries:
            self._entries.clear()
        weights = build()
        self._entries[key] = (versions, weights)
        return weights


def _used_rank(magnitudes: list[torch.Tensor]) -> int:
    """1 + the last rank index with a nonzero weight in any slice and slot ([G, rank] magnitudes each);
    0 when the module is not adapted at all (e.g. lm_head of adapters that do not target it)."""
    used = torch.stack([m.amax(dim=0) for m in magnitudes]).amax(dim=0).nonzero()
    return int(used[-1]) + 1 if used.numel() else 0


def concat_a(lora_a_stacked: tuple[torch.Tensor, ...], slots, dtype) -> torch.Tensor:
    """[groups, slices * used_rank, hidden]"""
    parts = [slot_weights(a, slots).to(dtype) for a in lora_a_stacked]
    rank = _used_rank([p.abs().amax(dim=-1) for p in parts])
    return torch.cat([p[:, :rank] for p in parts], dim=1).contiguous()


def block_diagonal_b(lora_b_stacked: tuple[torch.Tensor, ...], slots, output_slices, dtype) -> torch.Tensor:
    """[groups, sum(output_slices), slices * used_rank]: slice i's B sits at rows of its output columns and
    columns of its rank block, zeros elsewhere."""
    parts = [slot_weights(b, slots)[:, :size].to(dtype) for b, size in zip(lora_b_stacked, output_slices)]
    rank = _used_rank([p.abs().amax(dim=-2) for p in parts])
    out = torch.zeros(parts[0].shape[0], sum(output_slices), rank * len(parts), dtype=dtype)
    row = 0
    for i, part in enumerate(parts):
        out[:, row: row + part.shape[1], i * rank: (i + 1) * rank] = part[:, :, :rank]
        row += part.shape[1]
    return out


def fused_shrink(buffer: torch.Tensor, x: torch.Tensor, lora_a_stacked, p: PaddedGroups, scale: float,
                 cache: FusedWeightCache) -> None:
    """buffer: [slices, tokens, max_rank] (float32, zeroed by the caller), x: [tokens, hidden]; rows without
    an adapter are untouched."""
    slices = buffer.shape[0]
    weights = cache.get(lora_a_stacked, p.slots, "a", lambda: concat_a(lora_a_stacked, p.slots, buffer.dtype))
    rank = weights.shape[1] // slices
    if rank == 0:
        return
    blocks = x.index_select(0, p.pad_rows).to(buffer.dtype).view(p.num_groups, p.max_len, -1)
    h = torch.bmm(blocks, weights.transpose(1, 2))  # [G, L, slices * rank]
    h.mul_(scale)
    picked = h.view(-1, slices, rank).index_select(0, p.valid)  # [n, slices, rank]
    buffer[:, :, :rank].index_copy_(1, p.rows, picked.transpose(0, 1))


def fused_expand(y: torch.Tensor, buffer: torch.Tensor, lora_b_stacked, output_slices, offset: int,
                 p: PaddedGroups, add_inputs: bool, cache: FusedWeightCache) -> None:
    """y: [tokens, total_out], buffer: [slices, tokens, rank]; y[rows, offset:offset+sum] (+)= LoRA output."""
    slices = buffer.shape[0]
    width = sum(output_slices)
    weights = cache.get(lora_b_stacked, p.slots, ("b", tuple(output_slices)),
                        lambda: block_diagonal_b(lora_b_stacked, p.slots, output_slices, y.dtype))
    rank = weights.shape[2] // slices
    if rank == 0:
        return
    gathered = buffer[:, :, :rank].index_select(1, p.pad_rows).to(y.dtype)  # [slices, G*L, rank]
    blocks = gathered.transpose(0, 1).reshape(p.num_groups, p.max_len, slices * rank)
    delta = torch.bmm(blocks, weights.transpose(1, 2)).view(-1, width).index_select(0, p.valid)  # [n, width]
    columns = y[:, offset: offset + width]
    if add_inputs:
        columns.index_add_(0, p.rows, delta)
    else:
        columns.index_copy_(0, p.rows, delta)
