from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from api.tenancy.adapter_slots import AdapterSlots, Overdue
from api.tenancy.admission import FairAdmission


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
    (("x", "y"), frozenset(), [W("z"), W("y")], 1),  # z would be a third adapter in the step
    (("x", "y"), frozenset(), [W("z"), W(None)], 1),  # the base model takes no adapter slot
    (("x", "y"), frozenset(), [W("z"), W("w")], None),
    (("x",), frozenset({"w"}), [W("z"), W("w"), W("x")], 2),  # x joins the running step
    (("x",), frozenset({"w"}), [W("z"), W("w")], 1),  # w is still in an engine slot
    (("x",), frozenset(), [W("z"), W("w")], 0),  # neither is: the tenant's order
    (("x", "y"), frozenset(), [W("z", enqueued_at=97.0), W("x")], Overdue(0)),  # waited 3 s > 2 s
    (("x",), frozenset(), [W("y"), W("z", enqueued_at=97.0), W("x")], 1),  # overdue and fits: it goes
    (("x",), frozenset(), [W("y", slots=2), W("x")], 0),  # only requests of the head's size are candidates
    ((), frozenset(), [], None),
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


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def settle_tasks() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def aware(max_running: int = 4, max_loras: int = 2, clock: FakeClock | None = None) -> FairAdmission:
    return FairAdmission(max_running, 100, clock=clock or FakeClock(),
                         adapters=AdapterSlots(max_loras, max_wait_s=2.0))


async def test_a_third_adapter_waits_with_slots_free_until_one_drains():
    admission = aware()
    x = await admission.acquire("A", 1, adapter="x")
    y = await admission.acquire("A", 1, adapter="y")
    prefetched = []
    z = asyncio.create_task(admission.acquire("A", 1, adapter="z", on_wait=lambda: prefetched.append("z")))
    base = await admission.acquire("A", 1)  # the base model still starts: 3 of 4 slots run
    await settle_tasks()
    assert not z.done() and prefetched == ["z"] and admission.running == 3
    admission.release(x)
    granted = await z
    assert granted.adapter == "z" and admission.adapters.running() == {"y": 1, "z": 1}
    for ticket in (y, base, granted):
        admission.release(ticket)
    assert admission.adapters.running() == {} and admission.running == 0


async def test_a_tenants_turn_goes_to_a_request_whose_adapter_runs():
    admission = aware(max_running=2)
    x = await admission.acquire("A", 1, adapter="x")
    y = await admission.acquire("A", 1, adapter="y")
    order: list[str] = []

    async def request(adapter: str) -> None:
        ticket = await admission.acquire("A", 1, adapter=adapter)
        order.append(adapter)
        await asyncio.sleep(0)
        admission.release(ticket)

    waiting = [asyncio.create_task(request(a)) for a in ("z", "y", "y")]
    await settle_tasks()
    admission.release(x)  # z could start now, but y runs already: both ys go first, one slot at a time
    await asyncio.gather(*waiting)
    assert order == ["y", "y", "z"]
    admission.release(y)


async def test_an_overdue_request_holds_back_the_others_until_its_adapter_fits():
    clock = FakeClock()
    admission = aware(max_running=3, clock=clock)
    x = await admission.acquire("A", 1, adapter="x")
    y = await admission.acquire("A", 1, adapter="y")
    z = asyncio.create_task(admission.acquire("A", 1, adapter="z"))
    await settle_tasks()
    early = await asyncio.wait_for(admission.acquire("B", 1, adapter="y"), 1.0)  # z waited 0 s: B's y starts
    admission.release(early)
    clock.now += 3.0
    held = asyncio.create_task(admission.acquire("B", 1, adapter="y"))
    await settle_tasks()
    assert not held.done() and not z.done()  # y runs and a slot is free, but z has waited 3 s
    admission.release(x)
    assert (await z).adapter == "z"
    await settle_tasks()
    assert held.done()  # y still runs, so B's request joins it beside z
    for ticket in (y, z.result(), held.result()):
        admission.release(ticket)
    assert admission.running == 0 and admission.adapters.running() == {}


async def test_another_tenant_starts_while_the_fairest_ones_adapter_does_not_fit():
    admission = aware(max_running=4)
    x = await admission.acquire("A", 1, adapter="x")
    y = await admission.acquire("A", 1, adapter="y")
    z = asyncio.create_task(admission.acquire("A", 1, adapter="z"))
    await settle_tasks()
    b = await asyncio.wait_for(admission.acquire("B", 1, adapter="y"), 1.0)
    assert not z.done()
    for ticket in (x, y, b):
        admission.release(ticket)
    admission.release(await z)


async def test_a_cancelled_waiter_blocked_on_its_adapter_leaves_the_queue():
    admission = aware(max_running=4)
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
