"""A stream's engine steps cross the Ray hop in batches: the first step alone and at once (time to first token), then
whatever steps the engine made within `window_s` of the batch's first, in one streaming item. Each item costs
the same to cross the hop (serialisation, one Ray message, a wake-up of the caller) whatever it holds, and both
ends take that CPU from the engine.

The engine's generator runs in a task of its own, so that waiting out a window never interrupts it; cancelling the
batches (the client went away) cancels that task, which closes the engine's generator (vLLM aborts the request).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")

_END = object()


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


async def coalesce(steps: AsyncIterator[T], window_s: float) -> AsyncIterator[list[T]]:
    """`steps` as lists: [first], then every step made within `window_s` of a batch's first (0: one per list)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        try:
            async for step in steps:
                queue.put_nowait(step)
        except Exception as e:  # noqa: BLE001 (re-raised by the reader)
            queue.put_nowait(_Failed(e))
        else:
            queue.put_nowait(_END)

    task = asyncio.create_task(pump())
    try:
        first = True
        while True:
            batch = [await queue.get()]
            if not first and window_s > 0:
                deadline = asyncio.get_running_loop().time() + window_s
                while batch[-1] is not _END and not isinstance(batch[-1], _Failed):
                    remaining = deadline - asyncio.get_running_loop().time()
                    if remaining <= 0:
                        break
                    try:
                        batch.append(await asyncio.wait_for(queue.get(), remaining))
                    except TimeoutError:
                        break
            while not queue.empty() and batch[-1] is not _END and not isinstance(batch[-1], _Failed):
                batch.append(queue.get_nowait())
            first = False
            end = batch[-1]
            steps_here = [step for step in batch if step is not _END and not isinstance(step, _Failed)]
            if steps_here:
                yield steps_here
            if isinstance(end, _Failed):
                raise end.error
            if end is _END:
                return
    finally:
        if not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
