"""The per-token LoRA reference the grouped and fused ops are checked against."""

from __future__ import annotations

import torch


def reference_lora(x, lora_a, lora_b, indices, scale):
    """y_t = scale * B[s_t] @ (A[s_t] @ x_t) for tokens with an adapter, 0 otherwise."""
    out = torch.zeros(x.shape[0], lora_b.shape[2])
    for t, slot in enumerate(indices.tolist()):
        if slot >= 0:
            out[t] = lora_b[slot, 0] @ (lora_a[slot, 0] @ x[t]) * scale
    return out
