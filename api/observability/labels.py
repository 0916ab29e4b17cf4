"""Bounded label values: a metric label never takes more than `top_n` distinct values (plus pinned ones)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

OTHER = "other"


class LabelBounder:
    """First come, first kept: the first `top_n` distinct values seen keep their own label, every later value
    becomes `other`. Values in `pinned` always keep their own label and take no slot; `other` itself is pinned.

    A value once admitted stays admitted for the life of the object, so a series never changes its label.
    """

    def __init__(self, top_n: int, pinned: Iterable[str] = ()):
        if top_n < 0:
            raise ValueError(f"top_n must be >= 0, got {top_n}")
        self.top_n = top_n
        self._pinned = frozenset(pinned) | {OTHER}
        self._admitted: set[str] = set()
        self._lock = threading.Lock()

    def bound(self, value: str) -> str:
        if value in self._pinned:
            return value
        with self._lock:
            if value in self._admitted:
                return value
            if len(self._admitted) < self.top_n:
                self._admitted.add(value)
                return value
        return OTHER

    def values(self) -> frozenset[str]:
        """Values admitted so far (pinned ones excluded)."""
        with self._lock:
            return frozenset(self._admitted)
