"""A circuit breaker per adapter version: closed, open after consecutive failures, half-open after a pause.

Pure: the clock is injected. Closed lets everything through and opens after `failures` failures in a row;
open refuses everything until `open_s` passed, then half-open lets one probe through at a time: its success
closes the breaker, its failure opens it again for another `open_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import IntEnum


class BreakerState(IntEnum):
    """Values as the `loraplex_breaker_state` gauge exports them."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    def __init__(self, failures: int, open_s: float, clock: Callable[[], float] = time.monotonic):
        if failures < 1 or open_s < 0:
            raise ValueError(f"need failures >= 1 and open_s >= 0, got {failures}, {open_s}")
        self.failures = failures
        self.open_s = open_s
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._consecutive = 0
        self._opened_at = 0.0
        self._probing = False
        self.opened = 0  # times it opened

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.open_s:
            self._state = BreakerState.HALF_OPEN
            self._probing = False
        return self._state

    def allow(self) -> bool:
        """Whether a request may try this version now; in half-open, the caller that gets True is the probe."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def abandon(self) -> None:
        """The request let through ended without a verdict (the client left, a 4xx): the next one may probe."""
        self._probing = False

    def success(self) -> None:
        self._consecutive = 0
        self._probing = False
        self._state = BreakerState.CLOSED

    def failure(self) -> None:
        state = self.state
        self._consecutive += 1
        self._probing = False
        if state is BreakerState.HALF_OPEN or (state is BreakerState.CLOSED and self._consecutive >= self.failures):
            self._state = BreakerState.OPEN
            self._opened_at = self._clock()
            self.opened += 1


class Breakers:
    """One breaker per version label, made on first use."""

    def __init__(self, failures: int, open_s: float, clock: Callable[[], float] = time.monotonic):
        self._make = lambda: CircuitBreaker(failures, open_s, clock)
        self._by_label: dict[str, CircuitBreaker] = {}

    def of(self, label: str) -> CircuitBreaker:
        breaker = self._by_label.get(label)
        if breaker is None:
            breaker = self._by_label[label] = self._make()
        return breaker

    def states(self) -> dict[str, BreakerState]:
        return {label: breaker.state for label, breaker in self._by_label.items()}
