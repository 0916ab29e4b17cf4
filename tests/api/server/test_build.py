"""What the builder derives from its parts: the adapter activity routers read."""

from __future__ import annotations

import asyncio

from api.server.build import lora_activity
from api.tenancy.fair_admission import FairAdmission
from engine.types import EngineLoad


class Engine:
    def load(self) -> EngineLoad:
        return EngineLoad(running_by_adapter={"a#0123456789abcdef": 1, "b#0123456789abcdef": 2},
                          waiting_by_adapter={"c#0123456789abcdef": 1})


def test_activity_names_adapters_as_clients_do_from_the_engine_and_admission():
    async def main():
        queue = FairAdmission(max_running=1, max_queued=8)
        held = await queue.acquire("t", 1.0, adapter="a@1")
        waiter = asyncio.ensure_future(queue.acquire("t", 1.0, adapter="d@4"))
        while queue.stats().queued == 0:  # until the waiter has joined the queue
            await asyncio.sleep(0)
        activity = lora_activity(Engine(), queue, 4)
        queue.release(held)
        queue.release(await waiter)
        return activity, lora_activity(Engine(), queue, 4)

    waiting_in_admission, after = asyncio.run(main())
    assert (sorted(waiting_in_admission.running), sorted(waiting_in_admission.waiting)) == (["a", "b"], ["c", "d"])
    assert sorted(after.waiting) == ["c"] and after.max_loras == 4
