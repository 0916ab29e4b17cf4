"""Background (batch) tickets: only on slots live traffic leaves free, preempted when live requests arrive."""

from __future__ import annotations

import asyncio
import time

import pytest

from api.tenancy.fair_admission import FairAdmission


async def _background(queue: FairAdmission, preempted: list[str], name: str, slots: int = 1):
    return await queue.background.acquire("batch", slots, lambda: preempted.append(name))


def test_background_takes_every_free_slot_on_an_idle_engine():
    async def main():
        queue, preempted = FairAdmission(max_running=3, max_queued=8), []
        tickets = [await _background(queue, preempted, str(i)) for i in range(3)]
        waiter = asyncio.ensure_future(_background(queue, preempted, "late"))
        await asyncio.sleep(0)
        assert not waiter.done() and queue.stats().background_running == 3
        queue.release(tickets[0])
        assert (await waiter).background and preempted == []
        assert queue.stats().running_by_tenant == {}  # no tenant's fair share is charged

    asyncio.run(main())


@pytest.mark.parametrize(("allowed", "held", "live_slots", "expected"), [
    # max_background_with_live, background tickets held, slots the live request asks -> preempted (newest first)
    (0, 2, 1, ["1", "0"]),
    (1, 3, 1, ["2", "1"]),
    (2, 2, 1, []),  # 2 background + 1 live fit in 4 slots and within the allowance
    (4, 4, 1, ["3"]),  # allowance permits them all, but the live request needs one slot
    (4, 4, 3, ["3", "2", "1"]),
])
def test_a_live_arrival_preempts_what_it_must(allowed, held, live_slots, expected):
    async def main():
        queue = FairAdmission(max_running=4, max_queued=8, max_background_with_live=allowed)
        preempted: list[str] = []
        tickets = [await _background(queue, preempted, str(i)) for i in range(held)]
        live = asyncio.ensure_future(queue.acquire("t", 1.0, live_slots))
        await asyncio.sleep(0)
        assert preempted == expected
        for ticket in tickets:  # holders give back what was preempted
            if str(tickets.index(ticket)) in preempted:
                queue.release(ticket)
        granted = await asyncio.wait_for(live, 1)
        assert granted.slots == live_slots and not granted.background

    asyncio.run(main())


def test_background_waits_while_live_runs_and_resumes_when_it_ends():
    async def main():
        queue, preempted = FairAdmission(max_running=4, max_queued=8), []
        live = await queue.acquire("t", 1.0)
        waiter = asyncio.ensure_future(_background(queue, preempted, "b"))
        await asyncio.sleep(0.01)
        assert not waiter.done()  # free slots, but a live request runs and the allowance is 0
        queue.release(live)
        ticket = await asyncio.wait_for(waiter, 1)
        assert ticket.queue_seconds >= 0 and queue.running == 1

    asyncio.run(main())


def test_background_never_jumps_waiting_live_requests():
    async def main():
        queue, preempted = FairAdmission(max_running=1, max_queued=8, max_background_with_live=1), []
        first = await queue.acquire("t", 1.0)
        second = asyncio.ensure_future(queue.acquire("t", 1.0))
        waiter = asyncio.ensure_future(_background(queue, preempted, "b"))
        await asyncio.sleep(0)
        queue.release(first)
        await asyncio.sleep(0)
        assert second.done() and not waiter.done()
        queue.release(second.result())
        await asyncio.wait_for(waiter, 1)

    asyncio.run(main())


def test_a_cancelled_background_waiter_leaves_nothing_behind():
    async def main():
        queue, preempted = FairAdmission(max_running=1, max_queued=8), []
        live = await queue.acquire("t", 1.0)
        waiter = asyncio.ensure_future(_background(queue, preempted, "b"))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        queue.release(live)
        assert queue.running == 0 and queue.stats().background_running == 0

    asyncio.run(main())


def test_after_live_traffic_background_waits_for_the_quiet_period():
    async def main():
        queue, preempted = FairAdmission(max_running=4, max_queued=8, background_quiet_s=0.2), []
        live = await queue.acquire("t", 1.0)
        waiter = asyncio.ensure_future(_background(queue, preempted, "b"))
        queue.release(live)
        released = time.monotonic()
        await asyncio.sleep(0.05)
        assert not waiter.done()  # the engine is free, but live traffic ran 50 ms ago
        await asyncio.wait_for(waiter, 2)
        assert time.monotonic() - released >= 0.2

    asyncio.run(main())


def test_a_live_arrival_restarts_the_quiet_period():
    async def main():
        queue, preempted = FairAdmission(max_running=4, max_queued=8, background_quiet_s=0.2), []
        queue.release(await queue.acquire("t", 1.0))
        waiter = asyncio.ensure_future(_background(queue, preempted, "b"))
        await asyncio.sleep(0.15)
        queue.release(await queue.acquire("t", 1.0))
        restarted = time.monotonic()
        await asyncio.wait_for(waiter, 2)
        assert time.monotonic() - restarted >= 0.2

    asyncio.run(main())
