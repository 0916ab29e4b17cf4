from __future__ import annotations

import pytest

from engine.cluster.affinity import ReplicaView, rank_replicas


def view(rid: str, ongoing: int, *resident: str, starved: tuple[str, ...] = ()) -> ReplicaView:
    return ReplicaView(rid, frozenset(resident), ongoing, frozenset(starved))


@pytest.mark.parametrize(("adapter", "replicas", "ranks"), [
    # No replicas: nothing to try.
    ("a@1", [], []),
    # The holder, though busier than the other.
    ("a@1", [view("r1", 0), view("r2", 1, "a@1")], [["r2"], ["r1"]]),
    # The holder at the threshold (2): the least loaded takes it and will load it.
    ("a@1", [view("r1", 0), view("r2", 2, "a@1")], [["r1"], ["r2"]]),
    # Two holders: the less loaded one.
    ("a@1", [view("r1", 1, "a@1"), view("r2", 0, "a@1"), view("r3", 0)], [["r2"], ["r3", "r1"]]),
    # Another version of the same name is not a holder.
    ("a@2", [view("r1", 0), view("r2", 1, "a@1")], [["r1"], ["r2"]]),
    # The base model: least loaded.
    (None, [view("r1", 3, "a@1"), view("r2", 1)], [["r2"], ["r1"]]),
    # One replica: it, busy or not.
    ("a@1", [view("r1", 9)], [["r1"]]),
    # The holder's requests for the adapter wait there for an engine slot: the least loaded takes it.
    ("a@1", [view("r1", 0), view("r2", 1, "a@1", starved=("a@1",))], [["r1"], ["r2"]]),
    # Another holder, not starved, takes it though busier.
    ("a@1", [view("r1", 1, "a@1"), view("r2", 0, "a@1", starved=("a@1",))], [["r1"], ["r2"]]),
    # Another adapter starved there does not matter.
    ("a@1", [view("r1", 0), view("r2", 1, "a@1", "b@1", starved=("b@1",))], [["r2"], ["r1"]]),
    # Ties in load keep the given order (the router shuffles it).
    ("a@1", [view("r2", 0), view("r1", 0)], [["r2"], ["r1"]]),
])
def test_rank_replicas(adapter, replicas, ranks):
    assert rank_replicas(adapter, replicas, max_ongoing=2) == ranks
