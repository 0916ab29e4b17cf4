"""The native grouped LoRA kernel (engine/worker/csrc/lora_kernel.cpp): one call per LoRA module does shrink and
expand for every adapter segment of the batch, instead of the eager ops' dozen torch ops per module.

The extension is built at install (`make venv` runs scripts/build_kernel.py); `KERNEL` is None when it was not,
and `UNAVAILABLE` says why. The kernel reads weights prepared per module: A of every slice packed as
[slots, slices, rank, hidden], B transposed as [slots, rank, sum(output_slices)] so its inner loops run along
contiguous memory, both float32 and trimmed to the ranks the slots use, with each slot's own rank. Prepared
weights are cached per module and rebuilt when vLLM rewrites a slot in place (version counters, as in
`engine.worker.fused_ops`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.worker.batch_plan import Segments

try:
    from engine.worker import _lora_kernel as KERNEL

    UNAVAILABLE = ""
except ImportError as e:  # not built (a plain `pip install`), or built against another torch
    KERNEL = None
    UNAVAILABLE = f"{type(e).__name__}: {e}"


@dataclass(frozen=True)
class PreparedWeights:
    a: torch.Tensor  # [slots, slices, rank, hidden] float32
    bt: torch.Tensor  # [slots, rank, width] float32
    ranks: torch.Tensor  # [slots] int32: each slot's used rank
    bounds: list[int]  # [slices + 1] column bounds of the slices within width


def _last_nonzero(mask: torch.Tensor) -> torch.Tensor:
    """[..., n] bool -> [...] 1 + index of the last True, 0 when none."""
    positions = torch.arange(1, mask.shape[-1] + 1)
    return (mask * positions).amax(dim=-1)


def prepare(lora_a_stacked: tuple[torch.Tensor, ...], lora_b_stacked: tuple[torch.Tensor, ...],
            output_slices: tuple[int, ...]) -> PreparedWeights:
    """From vLLM's stacked weights, [slots, 1, max_rank, hidden] and [slots, 1, >= out, max_rank] per slice."""
    a = torch.stack([t[:, 0] for t in lora_a_stacked], dim=1).float()  # [S, N, max_rank, H]
    b = [t[:, 0, :size].float() for t, size in zip(lora_b_stacked, output_slices)]  # [S, out, max_rank] each
    used = (a.abs().amax(dim=-1) > 0).any(dim=1)  # [S, max_rank]
    for part in b:
        used |= part.abs().amax(dim=1) > 0
    ranks = _last_nonzero(used).to(torch.int32)
    rank = int(ranks.max()) if ranks.numel() else 0
    bt = torch.cat([part[:, :, :rank].transpose(1, 2) for part in b], dim=2).contiguous()
    bounds = [0]
    for size in output_slices:
        bounds.append(bounds[-1] + size)
    return PreparedWeights(a[:, :, :rank].contiguous(), bt, ranks, bounds)


class PreparedCache:
    """Prepared weights per module, keyed by its stacked tensors and valid while their versions are unchanged."""

    def __init__(self, max_entries: int = 1024):
        self._entries: dict[tuple, tuple[tuple, PreparedWeights]] = {}
        self._max_entries = max_entries

    def get(self, lora_a_stacked, lora_b_stacked, output_slices) -> PreparedWeights:
        key = (lora_a_stacked[0].data_ptr(), lora_b_stacked[0].data_ptr(), tuple(output_slices))
        try:
            versions = tuple((t.data_ptr(), t._version) for t in (*lora_a_stacked, *lora_b_stacked))
        except RuntimeError:  # inference-mode tensors keep no version counter: never cache them
            return prepare(lora_a_stacked, lora_b_stacked, output_slices)
        hit = self._entries.get(key)
        if hit is not None and hit[0] == versions:
            return hit[1]
        if len(self._entries) >= self._max_entries:
            self._entries.clear()
        weights = prepare(lora_a_stacked, lora_b_stacked, output_slices)
        self._entries[key] = (versions, weights)
        return weights


def native_lora_linear(y: torch.Tensor, x: torch.Tensor, lora_a_stacked, lora_b_stacked, scale: float,
                       output_slices, offset: int, seg: Segments, cache: PreparedCache,
                       add_inputs: bool = True) -> None:
    """y[rows, offset:offset + sum(output_slices)] (+)= scale * x[rows] @ A^T @ B^T per token's slot.

    y: [tokens, total_out] and x: [tokens, hidden], float32 or bfloat16 (one dtype); rows without an adapter
    are untouched."""
    w = cache.get(tuple(lora_a_stacked), tuple(lora_b_stacked), tuple(output_slices))
    if w.a.shape[2] == 0:
        return
    KERNEL.lora_linear(y, x, w.a, w.bt, w.ranks, seg.order, seg.starts, seg.slots, w.bounds, offset, scale, add_inputs)
