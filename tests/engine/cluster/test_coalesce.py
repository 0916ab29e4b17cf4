from __future__ import annotations

import asyncio

import pytest

from engine.cluster.coalesce import coalesce

LONG_S = 60.0  # a window no step of these tests waits out: each batch ends on an event
SOON_S = LONG_S / 2  # an answer that waited the window out would come later than this


async def soon(awaitable):
    return await asyncio.wait_for(awaitable, SOON_S)


class Source:
    """Engine steps released by the test: `release(n)` lets n more out; `finish()` ends the stream."""

    def __init__(self, fail_after: int | None = None):
        self.fail_after = fail_after
        self.allowed = 0
        self.finished = False
        self.closed = False
        self._changed = asyncio.Event()

    def release(self, n: int = 1, finish: bool = False) -> None:
        self.allowed += n
        self.finished = finish
        self._changed.set()

    async def steps(self):
        made = 0
        try:
            while True:
                while made == self.allowed and not self.finished:
                    self._changed.clear()
                    await self._changed.wait()
                if made == self.allowed:
                    return
                if made == self.fail_after:
                    raise RuntimeError("engine failed")
                made += 1
                yield made
        finally:
            self.closed = True


async def test_without_a_window_every_step_is_its_own_item():
    source = Source()
    batches = coalesce(source.steps(), 0)
    source.release()
    assert await anext(batches) == [1]
    source.release()
    assert await anext(batches) == [2]
    source.release(0, finish=True)
    with pytest.raises(StopAsyncIteration):
        await anext(batches)


async def test_the_first_step_leaves_at_once_and_later_ones_wait_for_the_window():
    source = Source()
    batches = coalesce(source.steps(), LONG_S)
    source.release()
    assert await soon(anext(batches)) == [1]  # a long window, yet the first step is not held back
    source.release()
    later = asyncio.ensure_future(anext(batches))
    await asyncio.sleep(0)
    # sleep(0) is a turn of the event loop, not a delay: without a window, these turns would deliver [2].
    for _ in range(3):
        await asyncio.sleep(0)
        assert not later.done()  # step 2 waits for the window (or the stream's end)
    source.release(2, finish=True)
    assert await soon(later) == [2, 3, 4]  # the end closes the window early
    with pytest.raises(StopAsyncIteration):
        await anext(batches)


async def test_steps_already_made_go_with_the_first():
    source = Source()
    source.release(3)
    batches = coalesce(source.steps(), LONG_S)
    first = await soon(anext(batches))
    assert first[0] == 1 and first == list(range(1, len(first) + 1))


@pytest.mark.parametrize("window_s", [0, LONG_S])
async def test_an_engine_failure_comes_after_the_steps_made_before_it(window_s):
    source = Source(fail_after=2)
    batches = coalesce(source.steps(), window_s)
    source.release()
    assert await anext(batches) == [1]
    source.release(2)
    got = []
    with pytest.raises(RuntimeError, match="engine failed"):
        async for batch in batches:
            got += batch
    assert got == [2]


async def test_closing_the_batches_closes_the_engine_stream():
    source = Source()
    batches = coalesce(source.steps(), LONG_S)
    source.release()
    assert await anext(batches) == [1]
    pending = asyncio.ensure_future(anext(batches))
    await asyncio.sleep(0)
    pending.cancel()  # the client went away while the replica waited for a step
    with pytest.raises(asyncio.CancelledError):
        await pending
    await batches.aclose()
    assert source.closed
