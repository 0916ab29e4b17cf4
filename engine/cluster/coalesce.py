"""A stream's engine steps cross the Ray hop in batches: the first step alone and at once (time to first token), then
whatever steps the engine made within `window_s` of the batch's first, in one streaming item. Each item costs
the same to cross the hop (serialisation, one message, a wake-up of the caller) whatever it holds, and both
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
    ended = asyncio.Event()  # the end (or a failure) is the last thing queued

    async def pump() -> None:
        try:
            async for step in steps:
                queue.put_nowait(step)
        except Exception as e:  # noqa: BLE001 (re-raised by the reader)
            queue.put_nowait(_Failed(e))
        else:
            queue.put_nowait(_END)
        ended.set()

    task = asyncio.create_task(pump())
    try:
        first = True
        while True:
            batch = [await queue.get()]
            if not first and window_s > 0 and not ended.is_set():
                try:  # one timer per batch, not per step: the window, or the stream's end if sooner
                    await asyncio.wait_for(ended.wait(), window_s)
                except TimeoutError:
                    pass
            first = False
            while not queue.empty():
                batch.append(queue.get_nowait())
            last = batch[-1]
            made = batch[:-1] if last is _END or isinstance(last, _Failed) else batch
            if made:
                yield made
            if isinstance(last, _Failed):
                raise last.error
            if last is _END:
                return
    finally:
        if not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
