from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from api.tenancy.adapter_slots import AdapterSlots
from api.tenancy.fair_admission import FairAdmission
from tests.api.tenancy.admission_clock import FakeClock, settle_tasks


@dataclass
class W:
    adapter: str | None
    slots: int = 1
    enqueued_at: float = 100.0


def slots_running(*adapters: str, resident: frozenset[str] = frozenset(), max_loras: int = 2) -> AdapterSlots:
    slots = AdapterSlots(max_loras, resident=lambda: resident, max_wait_s=2.0)
    for adapter in adapters:
        slots.start(adapter)
    return slots


@pytest.mark.parametrize(("running", "resident", "waiting", "chosen"), [
    # running adapters (max_loras 2), adapters still in engine slots, the tenant's waiting requests -> the choice
    ((), frozenset(), [W("x"), W("y")], 0),
    (("x", "y"), frozenset(), [W("z"), W("y")], 1),  # y joins the running step; z would be a third adapter
    (("x", "y"), frozenset(), [W("z"), W(None)], 1),  # the base model takes no adapter slot
    (("x", "y"), frozenset(), [W("z"), W("w")], 0),  # none fits: the head, to wait loaded in the engine
    (("x",), frozenset({"w"}), [W("z"), W("w"), W("x")], 2),  # x joins the running step
    (("x",), frozenset({"w"}), [W("z"), W("w")], 1),  # w is still in an engine slot
    (("x",), frozenset(), [W("z"), W("w")], 0),  # neither is: the tenant's order
    (("x", "y"), frozenset(), [W("z", enqueued_at=97.0), W("x")], 0),  # z waited 3 s > 2 s: it goes
    (("x",), frozenset(), [W("y"), W("z", enqueued_at=97.0), W("x")], 1),
    (("x",), frozenset(), [W("y", slots=2), W("x")], 0),  # only requests of the head's size are candidates
])
def test_choose(running, resident, waiting, chosen):
    assert slots_running(*running, resident=resident).choose(waiting, now=100.0) == chosen


def test_adapters_are_counted_per_request():
    slots = slots_running("x", "x", "y")
    slots.stop("x")
    assert slots.running() == {"x": 1, "y": 1} and not slots.fits("z")
    slots.stop("x")
    slots.stop(None)
    assert slots.running() == {"y": 1} and slots.fits("z")


@pytest.mark.parametrize("args", [(0, 2.0, 4), (2, -1.0, 4), (2, 2.0, 0)])
def test_rejects_bad_sizes(args):
    max_loras, max_wait_s, window = args
    with pytest.raises(ValueError):
        AdapterSlots(max_loras, max_wait_s=max_wait_s, window=window)


def aware(max_running: int = 4, max_loras: int = 2, clock: FakeClock | None = None) -> FairAdmission:
    return FairAdmission(max_running, 100, clock=clock or FakeClock(),
                         adapters=AdapterSlots(max_loras, max_wait_s=2.0))


async def test_nothing_waits_for_its_adapter_while_slots_are_free():
    admission = aware(max_running=4)
    tickets = [await asyncio.wait_for(admission.acquire("A", 1, adapter=a), 1.0) for a in ("x", "y", "z")]
    assert admission.adapters.running() == {"x": 1, "y": 1, "z": 1}  # z waits loaded in the engine
    for ticket in tickets:
        admission.release(ticket)
    assert admission.adapters.running() == {} and admission.running == 0


async def test_a_tenants_turn_goes_to_a_request_whose_adapter_runs():
    admission = aware(max_running=2)
    x = await admission.acquire("A", 1, adapter="x")
    y = await admission.acquire("A", 1, adapter="y")
    order: list[str] = []
    prefetched: list[str] = []

    async def request(adapter: str) -> None:
        ticket = await admission.acquire("A", 1, adapter=adapter, on_wait=lambda: prefetched.append(adapter))
        order.append(adapter)
        await asyncio.sleep(0)
        admission.release(ticket)

    waiting = [asyncio.create_task(request(a)) for a in ("z", "y", "y")]
    await settle_tasks()
    assert prefetched == ["z", "y", "y"]
    admission.release(x)  # z could start now, but y runs already: both ys go first, one slot at a time
    await asyncio.gather(*waiting)
    assert order == ["y", "y", "z"]
    admission.release(y)


async def test_a_request_passed_over_too_long_goes_next():
    clock = FakeClock()
    admission = aware(max_running=2, clock=clock)
    x = await admission.acquire("A", 1, adapter="x")
    y = await admission.acquire("A", 1, adapter="y")
    z = asyncio.create_task(admission.acquire("A", 1, adapter="z"))
    await settle_tasks()
    clock.now += 3.0
    more_y = asyncio.create_task(admission.acquire("A", 1, adapter="y"))
    await settle_tasks()
    admission.release(x)
    await settle_tasks()
    assert z.done() and not more_y.done()  # z waited 3 s: it goes before y, which runs already
    admission.release(y)
    admission.release(await more_y)
    admission.release(z.result())
    assert admission.running == 0 and admission.adapters.running() == {}


async def test_fair_order_between_tenants_is_kept():
    admission = aware(max_running=1)
    holder = await admission.acquire("A", 1, adapter="x")
    b = asyncio.create_task(admission.acquire("B", 1, adapter="z"))  # B's turn comes first
    await settle_tasks()
    a = asyncio.create_task(admission.acquire("A", 1, adapter="x"))  # joins the step, but A just ran
    await settle_tasks()
    admission.release(holder)
    await settle_tasks()
    assert b.done() and not a.done()
    admission.release(b.result())
    admission.release(await a)


async def test_a_shadow_does_not_bring_an_adapter_one_too_many():
    admission = aware(max_running=8)
    x = await admission.acquire("A", 1, adapter="x")
    y = await admission.acquire("A", 1, adapter="y")
    assert admission.try_acquire_idle("shadow", 1, keep_free=1, adapter="z") is None
    shadow = admission.try_acquire_idle("shadow", 1, keep_free=1, adapter="y")
    assert shadow is not None
    for ticket in (x, y, shadow):
        admission.release(ticket)
    assert admission.adapters.running() == {}


async def test_a_cancelled_waiter_leaves_the_queue():
    admission = aware(max_running=2)
    x = await admission.acquire("A", 1, adapter="x")
    y = await admission.acquire("A", 1, adapter="y")
    z = asyncio.create_task(admission.acquire("A", 1, adapter="z"))
    await settle_tasks()
    z.cancel()
    with pytest.raises(asyncio.CancelledError):
        await z
    assert admission.stats().queued == 0
    admission.release(x)
    admission.release(y)
    assert admission.running == 0 and admission.adapters.running() == {}
