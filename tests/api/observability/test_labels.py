from __future__ import annotations

import threading

import pytest

from api.observability.labels import OTHER, LabelBounder


@pytest.mark.parametrize("top_n, pinned, seen, expected", [
    (2, (), ["a", "b", "c", "a", "d", "b"], ["a", "b", OTHER, "a", OTHER, "b"]),
    (0, (), ["a", "b"], [OTHER, OTHER]),
    (1, ("unknown",), ["unknown", "a", "unknown", "b"], ["unknown", "a", "unknown", OTHER]),
    (1, (), [OTHER, "a", "b"], [OTHER, "a", OTHER]),  # `other` itself takes no slot
    (3, (), ["x", "x", "x", "y"], ["x", "x", "x", "y"]),
])
def test_first_come_first_kept(top_n, pinned, seen, expected):
    bounder = LabelBounder(top_n, pinned=pinned)
    assert [bounder.bound(v) for v in seen] == expected


@pytest.mark.parametrize("top_n, distinct", [(2, 5), (5, 5), (10, 3), (1, 100)])
def test_distinct_labels_never_exceed_bound(top_n, distinct):
    bounder = LabelBounder(top_n)
    labels = {bounder.bound(f"v{i}") for i in range(distinct) for _ in range(3)}
    assert len(labels) == min(distinct, top_n) + (1 if distinct > top_n else 0)
    assert bounder.values() == {f"v{i}" for i in range(min(distinct, top_n))}


def test_rejects_negative_bound():
    with pytest.raises(ValueError):
        LabelBounder(-1)


def test_concurrent_admission_respects_bound():
    bounder = LabelBounder(10)
    results: dict[str, set[str]] = {}
    lock = threading.Lock()
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        start.wait()
        for i in range(200):
            value = f"v{(i * 7 + n) % 50}"
            label = bounder.bound(value)
            with lock:
                results.setdefault(value, set()).add(label)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(bounder.values()) == 10
    assert all(len(labels) == 1 for labels in results.values())  # a value never changes label
    assert {label for labels in results.values() for label in labels} == bounder.values() | {OTHER}
