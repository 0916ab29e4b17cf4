from __future__ import annotations

from collections import Counter

import pytest

from api.tenancy.fair_queue import FairQueue


def drain(queue: FairQueue, n: int | None = None) -> str:
    out = []
    while len(queue) and (n is None or len(out) < n):
        out.append(queue.pop()[0])
    return "".join(out)


@pytest.mark.parametrize(("pushes", "order"), [
    # (tenant, weight, count) in push order -> tenants in pop order
    ([("A", 1, 3), ("B", 1, 3)], "ABABAB"),
    ([("A", 1, 3), ("B", 1, 3), ("C", 1, 3)], "ABCABCABC"),
    ([("A", 4, 8), ("B", 1, 2)], "ABAAAABAAA"),
    ([("A", 2, 4), ("B", 1, 4)], "ABAABABB"),
    ([("A", 1, 1), ("B", 1, 3)], "ABBB"),
])
def test_fair_queue_order(pushes, order):
    queue: FairQueue[int] = FairQueue()
    for tenant, weight, count in pushes:
        for i in range(count):
            queue.push(tenant, i, weight)
    assert drain(queue) == order


def test_per_tenant_fifo():
    queue: FairQueue[int] = FairQueue()
    for i in range(5):
        queue.push("A", i, 1)
        queue.push("B", 10 + i, 3)
    popped = [queue.pop() for _ in range(10)]
    assert [item for tenant, item in popped if tenant == "A"] == [0, 1, 2, 3, 4]
    assert [item for tenant, item in popped if tenant == "B"] == [10, 11, 12, 13, 14]


def test_weights_give_proportional_shares_by_tenant():
    queue: FairQueue[None] = FairQueue()
    for _ in range(400):
        queue.push("heavy", None, 4)
        queue.push("light", None, 1)
    served = Counter(queue.pop()[0] for _ in range(250))
    assert served == {"heavy": 200, "light": 50}


@pytest.mark.parametrize(("already_served", "next_two"), [
    (0, ["flood", "new"]),  # the flood's head was queued first at the same virtual time
    (1, ["new", "flood"]),
    (10, ["new", "flood"]),
    (99, ["new", "flood"]),
])
def test_a_flooding_tenant_cannot_starve_a_newcomer(already_served, next_two):
    queue: FairQueue[None] = FairQueue()
    for _ in range(100):
        queue.push("flood", None, 1)
    drain(queue, already_served)
    queue.push("new", None, 1)
    assert [queue.pop()[0] for _ in range(2)] == next_two


def test_an_idle_tenant_banks_no_credit():
    queue: FairQueue[None] = FairQueue()
    for _ in range(20):
        queue.push("busy", None, 1)
    drain(queue, 10)
    for _ in range(3):
        queue.push("idle", None, 1)
    # the returning tenant shares from now on, instead of taking ten turns in a row
    assert drain(queue, 6).replace("busy", "b").replace("idle", "i") == "ibibib"


def test_cost_scales_the_share():
    queue: FairQueue[None] = FairQueue()
    for _ in range(10):
        queue.push("big", None, 1, cost=3)
        queue.push("small", None, 1, cost=1)
    served = Counter(queue.pop()[0] for _ in range(8))
    assert served == {"big": 2, "small": 6}


def test_remove_skips_the_item_and_returns_its_share():
    queue: FairQueue[str] = FairQueue()
    a1 = queue.push("A", "a1", 1)
    queue.push("B", "b1", 1)
    a2 = queue.push("A", "a2", 1)
    assert queue.remove(a2) and not queue.remove(a2)
    assert queue.queued() == {"A": 1, "B": 1} and len(queue) == 2
    queue.push("A", "a3", 1)  # takes a2's place, not the one after it
    assert [queue.pop()[1] for _ in range(3)] == ["a1", "b1", "a3"]
    assert not queue.remove(a1)
    with pytest.raises(IndexError):
        queue.pop()


@pytest.mark.parametrize(("allowed", "order"), [
    ({"A", "B"}, "ABAB"),
    ({"B"}, "BB"),
    (set(), ""),
])
def test_pop_first_keeps_fair_order_among_allowed_tenants(allowed, order):
    queue: FairQueue[int] = FairQueue()
    for i in range(2):
        queue.push("A", i, 1)
        queue.push("B", i, 1)
    popped = []
    while (item := queue.pop_first(lambda tenant: tenant in allowed)) is not None:
        popped.append(item)
    assert "".join(t for t, _ in popped) == order
    assert [i for t, i in popped if t == "B"] == sorted(i for t, i in popped if t == "B")
    assert len(queue) == 4 - len(order)


@pytest.mark.parametrize(("weight", "cost"), [(0, 1), (-1, 1), (1, 0)])
def test_rejects_non_positive_weight_or_cost(weight, cost):
    with pytest.raises(ValueError):
        FairQueue().push("A", None, weight, cost)


def test_first_is_the_fairest_head_and_skips_removed_items():
    q: FairQueue[str] = FairQueue()
    q.push("A", "a1", 1.0)
    q.push("B", "b1", 1.0)
    q.push("A", "a2", 1.0)
    removed = q.push("B", "b2", 1.0)
    q.remove(removed)
    assert q.first(lambda t: True).item == "a1" and q.first(lambda t: t == "B").item == "b1"
    assert [e.item for e in q.window("A", 5)] == ["a1", "a2"] and q.window("A", 1)[0].item == "a1"
    assert q.take(q.first(lambda t: t == "B")) == ("B", "b1")
    assert q.queued() == {"A": 2} and q.first(lambda t: t == "B") is None


@pytest.mark.parametrize(("taken", "then"), [
    # A's items a0..a3 and B's b0..b1 (pushed alternately); `taken` starts first in A's turn
    (0, "b0 a1 b1 a2 a3"),
    (2, "b0 a0 b1 a1 a3"),  # A's turns and B's are as if a0 had gone; a0 and a1 keep their order
    (3, "b0 a0 b1 a1 a2"),
])
def test_take_starts_an_item_in_its_tenants_turn(taken, then):
    q: FairQueue[str] = FairQueue()
    for i in range(4):
        q.push("A", f"a{i}", 1.0)
        if i < 2:
            q.push("B", f"b{i}", 1.0)
    assert q.take(q.window("A", 4)[taken]) == ("A", f"a{taken}")
    assert " ".join(q.pop()[1] for _ in range(len(q))) == then


def test_removing_the_last_item_after_a_take_returns_its_share():
    q: FairQueue[str] = FairQueue()
    q.push("A", "a0", 1.0)
    last = q.push("A", "a1", 1.0)
    q.take(last)  # a0 now waits in a1's place, with a1's finish
    assert q.remove(q.window("A", 1)[0])
    q.push("B", "b0", 1.0)
    q.push("A", "a2", 1.0)
    assert [q.pop()[1] for _ in range(2)] == ["b0", "a2"]
