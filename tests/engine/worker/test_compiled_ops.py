"""LoRA as custom ops in a compiled graph: one graph, traced once, serves every step's mix of adapters."""

from __future__ import annotations

import types

import pytest
import torch
from vllm.lora.punica_wrapper import punica_cpu

from engine.worker import compiled_ops
from engine.worker.punica import make_grouped_wrapper
from tests.engine.worker.reference import reference_lora

SLICES = (16, 8, 8)


@pytest.mark.parametrize("value,wanted", [
    (None, True), ("on", True), ("1", True), ("true", True), ("off", False), ("0", False), ("FALSE", False),
])
def test_switch(monkeypatch, value, wanted):
    if value is None:
        monkeypatch.delenv(compiled_ops.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(compiled_ops.ENV_SWITCH, value)
    assert compiled_ops.wanted() is wanted


def test_switch_refuses_a_value_it_does_not_know(monkeypatch):
    monkeypatch.setenv(compiled_ops.ENV_SWITCH, "fast")
    with pytest.raises(ValueError, match=compiled_ops.ENV_SWITCH):
        compiled_ops.wanted()


def _compiled_wrapper(native: bool):
    compiled_ops.register_ops()
    wrapper = object.__new__(make_grouped_wrapper(punica_cpu.PunicaWrapperCPU, native, compiled=True))
    wrapper.op_id = compiled_ops.register_wrapper(wrapper)
    return wrapper


def _expected(y, x, lora_a, lora_b, indices):
    expected, offset = y.clone(), 0
    for a, b, n in zip(lora_a, lora_b, SLICES):
        expected[:, offset:offset + n] += reference_lora(x, a, b, indices, 1.0)
        offset += n
    return expected


@pytest.mark.parametrize("native", [False, True], ids=["eager", "native"])
def test_one_compiled_graph_follows_each_steps_plan(native):
    """Traced once (a second trace fails the test), the graph applies each step's adapters: the plan is read when
    the op runs, not frozen into the graph at its first step. Steps differ in adapters and in token count."""
    g = torch.Generator().manual_seed(3)
    lora_a = tuple(torch.randn(2, 1, 4, 32, generator=g) for _ in SLICES)
    lora_b = tuple(torch.randn(2, 1, n, 4, generator=g) for n in SLICES)
    wrapper = _compiled_wrapper(native)

    def layer(y, x):
        y = y * 1.0  # an op before and after the LoRA op, as the base layer's around it
        wrapper.add_lora_linear(y, x, lora_a, lora_b, 1.0, SLICES)
        return y + 0.0

    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    steps = [torch.tensor([0, -1, 1, 1, 0]), torch.tensor([-1, -1, -1, -1, -1]), torch.tensor([1, 1, 0, 0, 1]),
             torch.tensor([-1, 0, 1])]
    for i, indices in enumerate(steps):
        wrapper.plan_step(indices, indices)
        x = torch.randn(len(indices), 32, generator=g)
        y = torch.randn(len(indices), sum(SLICES), generator=g)
        with torch.compiler.set_stance("fail_on_recompile") if i else torch.compiler.set_stance("default"):
            out = compiled(y, x)
        torch.testing.assert_close(out, _expected(y, x, lora_a, lora_b, indices), rtol=1e-5, atol=1e-5)


def test_lifting_the_rule_hides_only_the_lora_config_from_the_platform(monkeypatch):
    from vllm.platforms.cpu import CpuPlatform

    seen = []

    def platform_rule(cls, vllm_config):
        seen.append(vllm_config.lora_config)
        vllm_config.compilation_config.mode = "NONE" if vllm_config.lora_config is not None else "DYNAMO_TRACE_ONCE"

    monkeypatch.setattr(CpuPlatform, "check_and_update_config", classmethod(platform_rule))
    compiled_ops.lift_eager_rule()
    compiled_ops.lift_eager_rule()  # idempotent: wrapped once
    config = types.SimpleNamespace(lora_config=object(), compilation_config=types.SimpleNamespace(mode=None,
                                                                                                   backend="inductor"))
    lora = config.lora_config
    CpuPlatform.check_and_update_config(config)
    assert seen == [None]
    assert config.compilation_config.mode == "DYNAMO_TRACE_ONCE" and config.lora_config is lora
