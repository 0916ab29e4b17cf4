"""What the admission tests share: a clock they move by hand, and a way to let woken waiters run."""

from __future__ import annotations

import asyncio


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def settle_tasks() -> None:
    for _ in range(5):
        await asyncio.sleep(0)
