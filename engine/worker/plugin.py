"""loraplex's vLLM general plugin (entry point group `vllm.general_plugins`).

vLLM loads it in every process it starts (front end, engine core, workers), which is where the LoRA ops run.
"""

from __future__ import annotations

from engine.worker import malloc_trim, orphan_guard


def register() -> None:
    orphan_guard.watch_parent()
    malloc_trim.start()
    # vLLM calls this while it imports itself; its platform and LoRA modules are only safe to import now.
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from engine.worker import isolation, punica

    isolation.install()
    punica.install()
