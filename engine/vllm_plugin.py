"""loraplex's vLLM general plugin (entry point group `vllm.general_plugins`).

vLLM loads it in every process it starts (front end, engine core, workers), which is where the LoRA ops run.
"""

from __future__ import annotations


def register() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from engine import lora_isolation, lora_kernels

    lora_isolation.install()
    lora_kernels.install()
