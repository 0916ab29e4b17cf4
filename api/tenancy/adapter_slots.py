"""Adapter-aware admission: which waiting request of a tenant starts next, given the adapters the engine runs.

The engine runs at most `max_loras` distinct adapters per step; a request whose adapter would be one too many
waits inside vLLM, holding an admission slot while it runs nothing. So when requests wait for admission (every
slot taken), the one that starts in its tenant's turn is the first whose adapter already runs (it joins the step
at no cost), else one whose adapter is still in an engine slot, else one that fits within `max_loras`, else the
head. A request passed over for `max_wait_s` goes next in its tenant's order whatever its adapter, so no adapter
waits for ever behind popular ones. Nothing is held back while slots are free: a request whose adapter does not
fit yet still goes to the engine, where it waits loaded and starts at the first step with room (holding such
requests back in admission instead was slower in two rounds of three, `scripts/bench_admission.py`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

_IN_SLOT, _FITS, _HEAD = 1, 2, 3  # ranks after a request whose adapter already runs (0): lower starts first


class Waiting(Protocol):
    """What the choice reads of a waiting request (`Ticket`)."""

    adapter: str | None
    slots: int
    enqueued_at: float


class AdapterSlots:
    """Adapters (labels) of the requests admission has started, counted per request; `resident()` gives the
    labels in the engine's slots now (kept by vLLM after their requests end)."""

    def __init__(self, max_loras: int, resident: Callable[[], Collection[str]] = frozenset,
                 max_wait_s: float = 2.0, window: int = 32):
        if max_loras <= 0 or max_wait_s < 0 or window <= 0:
            raise ValueError(f"need max_loras > 0, max_wait_s >= 0 and window > 0, got {max_loras}, "
                             f"{max_wait_s}, {window}")
        self.max_loras = max_loras
        self.max_wait_s = max_wait_s
        self.window = window  # how far into a tenant's queue the choice looks
        self._resident = resident
        self._running: Counter[str] = Counter()

    def running(self) -> dict[str, int]:
        return dict(self._running)

    def start(self, adapter: str | None) -> None:
        if adapter is not None:
            self._running[adapter] += 1

    def stop(self, adapter: str | None) -> None:
        if adapter is not None:
            self._running[adapter] -= 1
            if self._running[adapter] <= 0:
                del self._running[adapter]

    def fits(self, adapter: str | None) -> bool:
        return adapter is None or adapter in self._running or len(self._running) < self.max_loras

    def choose(self, waiting: Sequence[Waiting], now: float) -> int:
        """Index of the request to start among a tenant's first waiting ones (its head first; not empty). Only
        requests of the head's size are candidates, so the tenant's fair-queueing account stays exact."""
        for i, w in enumerate(waiting):
            if now - w.enqueued_at >= self.max_wait_s:
                return i
        resident = None
        best = (_HEAD, 0)
        for i, w in enumerate(waiting):
            if w.slots != waiting[0].slots or not self.fits(w.adapter):
                continue
            if w.adapter is None or w.adapter in self._running:
                return i
            if resident is None:
                resident = self._resident()
            rank = _IN_SLOT if w.adapter in resident else _FITS
            if rank < best[0]:
                best = (rank, i)
        return best[1]
