from __future__ import annotations

import asyncio

import pytest

from api.tenancy.fair_admission import FairAdmission, QueueFull
from tests.api.tenancy.admission_clock import FakeClock, settle_tasks


async def test_free_slots_are_granted_at_once():
    admission = FairAdmission(max_running=2, max_queued=0)
    a = await admission.acquire("A", 1)
    b = await admission.acquire("B", 1)
    assert a.queue_seconds == b.queue_seconds == 0
    assert admission.stats().running_by_tenant == {"A": 1, "B": 1}
    with pytest.raises(QueueFull):
        await admission.acquire("C", 1)
    admission.release(a)
    admission.release(a)
    assert admission.running == 1
    admission.release(b)
    assert admission.stats().running == 0


async def test_queue_full_when_max_queued_wait():
    clock = FakeClock()
    admission = FairAdmission(max_running=1, max_queued=2, clock=clock)
    holder = await admission.acquire("A", 1)
    waiters = [asyncio.create_task(admission.acquire("B", 1)) for _ in range(2)]
    await settle_tasks()
    assert admission.stats().queued_by_tenant == {"B": 2}
    with pytest.raises(QueueFull) as e:
        await admission.acquire("C", 1)
    assert e.value.retry_after_s >= 1.0
    clock.now += 2.5
    admission.release(holder)
    first = await waiters[0]
    assert first.queue_seconds == pytest.approx(2.5)
    admission.release(first)
    admission.release(await waiters[1])
    assert admission.stats().running == 0 and admission.stats().queued == 0


async def test_slots_are_handed_on_in_fair_order():
    admission = FairAdmission(max_running=1, max_queued=100)
    holder = await admission.acquire("X", 1)
    order: list[str] = []

    async def worker(tenant: str, weight: float) -> None:
        ticket = await admission.acquire(tenant, weight)
        order.append(tenant)
        await asyncio.sleep(0)
        admission.release(ticket)

    tasks = [asyncio.create_task(worker("A", 1)) for _ in range(4)]
    await settle_tasks()
    tasks += [asyncio.create_task(worker("B", 1)) for _ in range(4)]
    await settle_tasks()
    admission.release(holder)
    await asyncio.gather(*tasks)
    assert "".join(order) == "ABABABAB"
    assert admission.stats().running == 0


async def test_a_waiter_cancelled_while_queued_leaves_the_queue():
    admission = FairAdmission(max_running=1, max_queued=1)
    holder = await admission.acquire("A", 1)
    waiter = asyncio.create_task(admission.acquire("B", 1))
    await settle_tasks()
    assert admission.stats().queued == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.stats().queued == 0
    replacement = asyncio.create_task(admission.acquire("C", 1))  # the freed queue place is usable
    await settle_tasks()
    admission.release(holder)
    ticket = await replacement
    assert admission.stats().running_by_tenant == {"C": 1}
    admission.release(ticket)
    assert admission.stats().running == 0


async def test_a_waiter_cancelled_after_its_grant_hands_the_slot_on():
    admission = FairAdmission(max_running=1, max_queued=5)
    holder = await admission.acquire("A", 1)
    granted_then_cancelled = asyncio.create_task(admission.acquire("B", 1))
    next_in_line = asyncio.create_task(admission.acquire("C", 1))
    await settle_tasks()
    admission.release(holder)  # grants B's future; B's task has not run yet
    granted_then_cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await granted_then_cancelled
    ticket = await asyncio.wait_for(next_in_line, 1)
    assert ticket.tenant == "C"
    admission.release(ticket)
    assert admission.stats().running == 0


@pytest.mark.parametrize("window", [0.0, 0.01])
async def test_no_slot_leaks_under_random_cancellation(window):
    admission = FairAdmission(max_running=3, max_queued=1000, reserve_window_s=window)
    held: list = []

    async def client(i: int) -> None:
        ticket = await admission.acquire(f"t{i % 4}", 1 + i % 3)
        try:
            for _ in range(i % 3):
                await asyncio.sleep(0)
        finally:
            admission.release(ticket)
            held.append(i)

    tasks = [asyncio.create_task(client(i)) for i in range(60)]
    for round_ in range(40):
        await asyncio.sleep(0)
        if round_ % 2 == 0:
            for task in tasks[round_::7]:
                task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    stats = admission.stats()
    assert (stats.running, stats.queued) == (0, 0)
    assert 0 < len(held) < 60
    tickets = [await asyncio.wait_for(admission.acquire("x", 1), 1) for _ in range(3)]
    assert admission.running == 3
    for ticket in tickets:
        admission.release(ticket)


@pytest.mark.parametrize(("running", "queued", "window"), [(0, 0, 0), (0, 1, 0), (-1, 0, 0), (1, -1, 0), (1, 1, -1)])
def test_rejects_bad_sizes(running, queued, window):
    with pytest.raises(ValueError):
        FairAdmission(running, queued, reserve_window_s=window)


async def _b_then_a_flood(admission: FairAdmission) -> tuple[list, list, list]:
    """B runs 2, then A takes its 2 of 4 and queues 3 more (equal weights)."""
    b = [await admission.acquire("B", 1) for _ in range(2)]
    a = [await admission.acquire("A", 1) for _ in range(2)]
    waiting = [asyncio.create_task(admission.acquire("A", 1)) for _ in range(3)]
    await settle_tasks()
    assert admission.stats().running_by_tenant == {"A": 2, "B": 2}
    assert admission.stats().queued_by_tenant == {"A": 3}
    return b, a, waiting


@pytest.mark.parametrize(("window", "step", "b_waits"), [(0.0, 0.0, True), (0.0, 0.01, True), (2.0, 0.01, False)])
async def test_a_returning_client_finds_its_slot_free(window, step, b_waits):
    clock = FakeClock()
    admission = FairAdmission(max_running=4, max_queued=10, clock=clock, reserve_window_s=window)
    b, a, waiting = await _b_then_a_flood(admission)
    clock.now += step
    admission.release(b[0])  # B's client sends its next request a moment later
    await settle_tasks()
    assert sum(t.done() for t in waiting) == (1 if b_waits else 0)
    again = asyncio.create_task(admission.acquire("B", 1))
    await settle_tasks()
    assert again.done() is not b_waits
    for ticket in [*a, b[1], *[t.result() for t in waiting if t.done()]]:
        admission.release(ticket)
    await settle_tasks()
    for task in [again, *waiting]:
        admission.release(await asyncio.wait_for(task, 1))
    assert (admission.stats().running, admission.stats().queued) == (0, 0)


async def test_an_idle_tenant_claims_nothing():
    admission = FairAdmission(max_running=4, max_queued=10, reserve_window_s=60)
    b, a, waiting = await _b_then_a_flood(admission)
    for ticket in b:
        admission.release(ticket)
    await settle_tasks()
    assert sum(t.done() for t in waiting) == 2  # B has nothing running or waiting: its share goes to A
    assert admission.stats().running_by_tenant == {"A": 4}
    for ticket in [*a, *[t.result() for t in waiting if t.done()]]:
        admission.release(ticket)
    admission.release(await asyncio.wait_for(waiting[2], 1))


async def test_claims_lapse_after_the_window():
    clock = FakeClock()
    admission = FairAdmission(max_running=4, max_queued=10, clock=clock, reserve_window_s=0.05)
    b, a, waiting = await _b_then_a_flood(admission)
    admission.release(b[0])  # B keeps one request running and does not come back
    await settle_tasks()
    assert not any(t.done() for t in waiting)
    clock.now += 1.0
    first = await asyncio.wait_for(waiting[0], 1)  # woken by the window's timer, no other event
    assert first.tenant == "A" and not waiting[1].done()
    admission.release(b[1])  # B has nothing left: A takes the freed slot at once
    await settle_tasks()
    assert waiting[1].done()
    for ticket in [*a, first]:
        admission.release(ticket)
    for task in waiting[1:]:
        admission.release(await asyncio.wait_for(task, 1))
    assert (admission.stats().running, admission.stats().queued) == (0, 0)


@pytest.mark.parametrize(("heavy_weight", "borrowed"), [(1, False), (3, True)])
async def test_claims_follow_weights(heavy_weight, borrowed):
    admission = FairAdmission(max_running=4, max_queued=10, reserve_window_s=60)
    light = [await admission.acquire("light", 1) for _ in range(2)]
    heavy = [await admission.acquire("heavy", heavy_weight) for _ in range(2)]
    waiting = asyncio.create_task(admission.acquire("heavy", heavy_weight))
    await settle_tasks()
    admission.release(light[0])  # light still runs one: with equal weights it keeps its second slot
    await settle_tasks()
    assert waiting.done() is borrowed
    admission.release(light[1])
    for t in [*heavy, await asyncio.wait_for(waiting, 1)]:
        admission.release(t)
    assert admission.stats().running == 0


async def test_a_request_takes_a_slot_per_sequence():
    admission = FairAdmission(max_running=4, max_queued=10)
    three = await admission.acquire("A", 1, slots=3)
    assert admission.running == 3 and three.slots == 3
    one = await admission.acquire("B", 1, slots=1)
    waiting = asyncio.create_task(admission.acquire("B", 1, slots=2))
    await settle_tasks()
    assert not waiting.done() and admission.stats().queued == 1
    admission.release(three)
    two = await waiting
    assert admission.running == 3 and admission.stats().running_by_tenant == {"B": 3}
    admission.release(one)
    admission.release(two)
    assert admission.running == 0


async def test_more_sequences_than_slots_take_every_slot_and_still_run():
    admission = FairAdmission(max_running=4, max_queued=10)
    ticket = await admission.acquire("A", 1, slots=100)
    assert ticket.slots == 4 and admission.running == 4
    admission.release(ticket)
    assert admission.running == 0


async def test_free_slots_are_held_for_a_big_waiter_instead_of_small_newcomers():
    """Without the hold, one-sequence requests arriving as slots free up would keep a many-sequence request
    waiting for ever."""
    admission = FairAdmission(max_running=4, max_queued=10)
    small = [await admission.acquire("A", 1) for _ in range(4)]
    big = asyncio.create_task(admission.acquire("B", 1, slots=4))
    await settle_tasks()
    admission.release(small[0])
    newcomer = asyncio.create_task(admission.acquire("C", 1))
    await settle_tasks()
    assert not newcomer.done() and not big.done()  # the free slot is held for B
    for ticket in small[1:]:
        admission.release(ticket)
    granted = await big
    assert granted.slots == 4 and not newcomer.done()
    admission.release(granted)
    admission.release(await newcomer)
    assert admission.running == 0 and admission.stats().queued == 0


async def test_one_tenant_cannot_fill_the_whole_queue():
    admission = FairAdmission(max_running=1, max_queued=10, max_queued_per_tenant=3)
    holder = await admission.acquire("flood", 1)
    waiters = [asyncio.create_task(admission.acquire("flood", 1)) for _ in range(3)]
    await settle_tasks()
    with pytest.raises(QueueFull):
        await admission.acquire("flood", 1)
    newcomer = asyncio.create_task(admission.acquire("newcomer", 1))
    await settle_tasks()
    assert admission.stats().queued_by_tenant == {"flood": 3, "newcomer": 1}
    admission.release(holder)
    admission.release(await waiters[0])  # the flood's oldest waiter had the same tag and came first
    second = await newcomer  # within one round, ahead of the flood's other two
    assert not waiters[1].done() and not waiters[2].done()
    admission.release(second)
    for waiter in waiters[1:]:
        admission.release(await waiter)
    assert admission.running == 0


async def test_a_request_that_would_wait_too_long_is_refused_at_once():
    clock = FakeClock()
    admission = FairAdmission(max_running=2, max_queued=100, clock=clock, max_queue_wait_s=1.2)
    holders = [await admission.acquire("A", 1) for _ in range(2)]
    clock.now += 1.0
    for ticket in holders:  # mean hold time settles near 1 s
        admission.release(ticket)
    holders = [await admission.acquire("A", 1) for _ in range(2)]
    waiting = [asyncio.create_task(admission.acquire("B", 1)) for _ in range(2)]
    await settle_tasks()
    assert admission.expected_wait(2) > 1.2 >= admission.expected_wait(1)
    with pytest.raises(QueueFull) as e:
        await admission.acquire("C", 1)  # two ahead, two slots, ~1 s each: longer than 1.2 s
    assert e.value.retry_after_s >= 1.0
    for ticket in holders:
        admission.release(ticket)
    for task in waiting:
        admission.release(await task)
