"""The grouped punica wrapper and its installation: vLLM's CPU LoRA ops replaced by the grouped ones."""

from __future__ import annotations

import pytest
import torch
from vllm.lora.punica_wrapper import punica_cpu

from engine.worker import punica
from engine.worker.punica import make_grouped_wrapper
from tests.engine.worker.reference import reference_lora


def _wrapper_with(indices: torch.Tensor, native: bool = False, sampler: torch.Tensor | None = None):
    wrapper = object.__new__(make_grouped_wrapper(punica_cpu.PunicaWrapperCPU, native))
    wrapper.plan_step(indices, indices if sampler is None else sampler)
    return wrapper


both_kernels = pytest.mark.parametrize("native", [False, True], ids=["eager", "native"])


@both_kernels
def test_wrapper_add_lora_linear_matches_reference_for_merged_slices(native):
    """q/k/v as three slices of one merged output, as vLLM's QKV LoRA layer calls it."""
    g = torch.Generator().manual_seed(7)
    indices = torch.tensor([0, -1, 1, 1, 0])
    x = torch.randn(5, 32, generator=g)
    slices = (16, 8, 8)
    lora_a = tuple(torch.randn(2, 1, 4, 32, generator=g) for _ in slices)
    lora_b = tuple(torch.randn(2, 1, n, 4, generator=g) for n in slices)
    y = torch.randn(5, sum(slices), generator=g)
    expected = y.clone()
    offset = 0
    for a, b, n in zip(lora_a, lora_b, slices):
        expected[:, offset:offset + n] += reference_lora(x, a, b, indices, 1.0)
        offset += n
    _wrapper_with(indices, native).add_lora_linear(y, x, lora_a, lora_b, 1.0, slices)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)


@both_kernels
def test_wrapper_refuses_mismatched_rows(native):
    wrapper = _wrapper_with(torch.tensor([0, 1]), native)
    with pytest.raises(RuntimeError, match="LORAPLEX_LORA_KERNELS=stock"):
        wrapper.add_shrink(torch.zeros(1, 3, 4), torch.randn(3, 8), (torch.randn(2, 1, 4, 8),), 1.0)
    with pytest.raises(RuntimeError, match="LORAPLEX_LORA_KERNELS=stock"):
        wrapper.add_lora_linear(torch.zeros(3, 4), torch.randn(3, 8), (torch.randn(2, 1, 4, 8),),
                                (torch.randn(2, 1, 4, 4),), 1.0, (4,))


def test_unverified_vllm_version_fails_loudly(monkeypatch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    monkeypatch.delenv(punica.ENV_SWITCH, raising=False)
    with pytest.raises(RuntimeError, match="verified for vLLM"):
        punica.install()


def test_stock_switch_installs_nothing(monkeypatch):
    monkeypatch.setenv(punica.ENV_SWITCH, "stock")
    assert punica.install() is False
    monkeypatch.setenv(punica.ENV_SWITCH, "fast")
    with pytest.raises(ValueError):
        punica.install()


@pytest.mark.parametrize("value,built,native", [
    ("grouped", True, True), ("grouped", False, False), ("native", True, True), ("eager", True, False),
    ("eager", False, False),
])
def test_kernel_choice(monkeypatch, value, built, native):
    """The native kernel when built unless told otherwise; the eager grouped ops as the fallback."""
    if not built:
        monkeypatch.setattr(punica.native_ops, "KERNEL", None)
    assert punica.use_native(value) is native


def test_native_switch_without_the_kernel_fails_naming_the_build(monkeypatch):
    monkeypatch.setattr(punica.native_ops, "KERNEL", None)
    with pytest.raises(RuntimeError, match="scripts/build_kernel.py"):
        punica.use_native("native")


@both_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wrapper_add_lora_logits_groups_by_sequence_and_handles_padding(native, dtype):
    g = torch.Generator().manual_seed(3)
    sampler = torch.tensor([1, -1, 0])
    wrapper = _wrapper_with(torch.tensor([1, 1, -1, 0]), native, sampler)
    x = torch.randn(3, 16, generator=g).to(dtype)
    lora_a = torch.randn(2, 1, 4, 16, generator=g).to(dtype)
    lora_b = torch.randn(2, 1, 24, 4, generator=g).to(dtype)  # 24 rows: vocabulary padded past the 20 logits
    y = torch.randn(3, 20, generator=g).to(dtype)
    expected = y.float() + reference_lora(x.float(), lora_a.float(), lora_b.float(), sampler, 0.5)[:, :20]
    wrapper.add_lora_logits(y, x, lora_a, lora_b, 0.5)
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(y.float(), expected, rtol=tol, atol=tol)


@both_kernels
def test_wrapper_add_lora_logits_without_adapters_does_nothing(native):
    wrapper = _wrapper_with(torch.tensor([-1, -1]), native)
    y = torch.randn(2, 8)
    before = y.clone()
    wrapper.add_lora_logits(y, torch.randn(2, 4), torch.randn(1, 1, 2, 4), torch.randn(1, 1, 8, 2), 1.0)
    assert torch.equal(y, before)


@both_kernels
def test_wrapper_add_lora_linear_without_adapters_leaves_output_alone(native):
    wrapper = _wrapper_with(torch.tensor([-1, -1, -1]), native)
    y = torch.randn(3, 8)
    before = y.clone()
    wrapper.add_lora_linear(y, torch.randn(3, 4), (torch.randn(1, 1, 2, 4),), (torch.randn(1, 1, 8, 2),), 1.0, (8,))
    assert torch.equal(y, before)


def test_wrapper_add_lora_embedding_groups_by_token_and_skips_untargeted_embeddings():
    g = torch.Generator().manual_seed(5)
    indices = torch.tensor([1, -1, 0, 1])
    wrapper = _wrapper_with(indices)
    x = torch.randn(4, 4, generator=g)  # rows of the stacked embedding A: [tokens, rank]
    lora_b = torch.randn(2, 1, 8, 4, generator=g)
    y = torch.randn(4, 8, generator=g)
    expected = y.clone()
    for t, slot in enumerate(indices.tolist()):
        if slot >= 0:
            expected[t] += lora_b[slot, 0] @ x[t]
    wrapper.add_lora_embedding(y, x, lora_b)
    # The grouped matmul may round differently from the per-token loop: close, not bit for bit.
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    after_first = y.clone()
    untargeted = torch.zeros(2, 1, 8, 4)
    wrapper.add_lora_embedding(y, x, untargeted)
    torch.testing.assert_close(y, after_first, rtol=0, atol=0)  # skipped: y is untouched, not merely close
    untargeted[1, 0, 0, 0] = 1.0  # vLLM loads an adapter that targets the embeddings into slot 1
    wrapper.add_lora_embedding(y, x, untargeted)
    assert y[0, 0] == after_first[0, 0] + x[0, 0] and y[3, 0] == after_first[3, 0] + x[3, 0]
    assert torch.equal(y[1], after_first[1]) and torch.equal(y[2], after_first[2])
