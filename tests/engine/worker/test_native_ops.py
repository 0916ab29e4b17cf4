"""The native grouped LoRA kernel against the per-token reference on random inputs: slices, per-slot ranks
padded to the engine's maximum, tokens without an adapter, scattered segments, float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

from engine.worker import native_ops
from engine.worker.batch_plan import segments
from engine.worker.native_ops import PreparedCache, native_lora_linear, prepare

# (hidden, output slices, max_rank, per-slot ranks, tokens)
SHAPES = [
    (64, (64, 32, 32), 16, [4, 16, 8], 37),
    (96, (200, 200), 64, [16, 64, 1, 8], 130),
    (48, (48,), 8, [8, 8], 9),
    (1024, (301,), 32, [16, 32, 3], 20),  # one slice, columns not a multiple of the kernel's blocks
]


def test_kernel_is_built():
    """`make venv` builds it (scripts/build_kernel.py); every other test here runs it."""
    assert native_ops.KERNEL is not None, native_ops.UNAVAILABLE


def _stacked(hidden, slices, max_rank, ranks, g):
    """vLLM's layout: per slice [slots, 1, max_rank, hidden] / [slots, 1, out, max_rank], zero past the rank."""
    lora_a, lora_b = [], []
    for out in slices:
        a, b = torch.zeros(len(ranks), 1, max_rank, hidden), torch.zeros(len(ranks), 1, out, max_rank)
        for slot, r in enumerate(ranks):
            a[slot, 0, :r] = torch.randn(r, hidden, generator=g) / hidden ** 0.5
            b[slot, 0, :, :r] = torch.randn(out, r, generator=g)
        lora_a.append(a)
        lora_b.append(b)
    return tuple(lora_a), tuple(lora_b)


def _reference(y, x, lora_a, lora_b, indices, scale, slices, offset, add_inputs):
    """float64, token by token."""
    out = y.double().clone()
    for t, slot in enumerate(indices.tolist()):
        if slot < 0:
            continue
        column = offset
        for a, b, size in zip(lora_a, lora_b, slices):
            delta = b[slot, 0, :size].double() @ (a[slot, 0].double() @ x[t].double()) * scale
            out[t, column:column + size] = delta + (out[t, column:column + size] if add_inputs else 0)
            column += size
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("hidden,slices,max_rank,ranks,tokens", SHAPES)
@pytest.mark.parametrize("add_inputs", [True, False])
def test_matches_reference_on_random_inputs(dtype, tol, hidden, slices, max_rank, ranks, tokens, add_inputs):
    g = torch.Generator().manual_seed(hidden + tokens)
    lora_a, lora_b = _stacked(hidden, slices, max_rank, ranks, g)
    indices = torch.randint(-1, len(ranks), (tokens,), generator=g)  # scattered, with base-model tokens
    offset = 5
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    y = torch.randn(tokens, offset + sum(slices) + 3, generator=g).to(dtype)
    before = y.clone()
    expected = _reference(y, x, [a.to(dtype) for a in lora_a], [b.to(dtype) for b in lora_b], indices, 0.5,
                          slices, offset, add_inputs)
    native_lora_linear(y, x, [a.to(dtype) for a in lora_a], [b.to(dtype) for b in lora_b], 0.5, slices, offset,
                       segments(indices), PreparedCache(), add_inputs)
    scale = expected.abs().amax().item()
    torch.testing.assert_close(y.double(), expected, rtol=tol, atol=tol * scale)
    base_rows = indices < 0
    assert torch.equal(y[base_rows], before[base_rows])
    outside = [c for c in range(y.shape[1]) if not offset <= c < offset + sum(slices)]
    assert torch.equal(y[:, outside], before[:, outside])


def test_prepare_keeps_each_slots_rank():
    g = torch.Generator().manual_seed(0)
    lora_a, lora_b = _stacked(16, (8, 4), 32, [3, 0, 17], g)
    w = prepare(lora_a, lora_b, (8, 4))
    assert w.ranks.tolist() == [3, 0, 17]
    assert w.a.shape == (3, 2, 17, 16) and w.bt.shape == (3, 17, 12) and w.bounds == [0, 8, 12]
    torch.testing.assert_close(w.bt[2, :, 8:], lora_b[1][2, 0, :, :17].T)


def test_unadapted_module_and_base_only_batch_leave_y_alone():
    x, y = torch.randn(4, 16), torch.randn(4, 8)
    before = y.clone()
    zeros = ((torch.zeros(2, 1, 4, 16),), (torch.zeros(2, 1, 8, 4),))
    native_lora_linear(y, x, *zeros, 1.0, (8,), 0, segments(torch.tensor([0, 1, 1, 0])), PreparedCache())
    g = torch.Generator().manual_seed(1)
    lora_a, lora_b = _stacked(16, (8,), 4, [4, 4], g)
    native_lora_linear(y, x, lora_a, lora_b, 1.0, (8,), 0, segments(torch.tensor([-1, -1, -1, -1])), PreparedCache())
    assert torch.equal(y, before)


def test_cache_sees_in_place_rewrites_of_a_slot():
    """vLLM loads another adapter into a slot with copy_: the prepared weights must follow."""
    g = torch.Generator().manual_seed(2)
    lora_a, lora_b = _stacked(32, (16, 16), 8, [2, 4], g)
    indices, x, cache = torch.tensor([0, 1, 0]), torch.randn(3, 32, generator=g), PreparedCache()
    native_lora_linear(torch.zeros(3, 32), x, lora_a, lora_b, 1.0, (16, 16), 0, segments(indices), cache)
    new_a, new_b = _stacked(32, (16, 16), 8, [6, 4], g)
    for old, new in zip(lora_a + lora_b, new_a + new_b):
        old[0].copy_(new[0])
    y = torch.zeros(3, 32)
    native_lora_linear(y, x, lora_a, lora_b, 1.0, (16, 16), 0, segments(indices), cache)
    expected = _reference(torch.zeros(3, 32), x, lora_a, lora_b, indices, 1.0, (16, 16), 0, True)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)


def test_kernel_rejects_mismatched_shapes():
    w = prepare((torch.ones(1, 1, 2, 8),), (torch.ones(1, 1, 4, 2),), (4,))
    seg = segments(torch.tensor([0]))
    with pytest.raises(RuntimeError, match="weight shapes"):
        native_ops.KERNEL.lora_linear(torch.zeros(1, 4), torch.zeros(1, 9), w.a, w.bt, w.ranks, seg.order,
                                      seg.starts, seg.slots, w.bounds, 0, 1.0, True)
