"""Builders shared by the observability tests: a settable clock and RequestOutcome with defaults."""

from __future__ import annotations

from dataclasses import replace

import pytest

from api.observability.outcome import RequestOutcome

BASE_OUTCOME = RequestOutcome(
    request_id="req-1", tenant="acme", priority="normal", model="base", version="", status=200,
    prompt_tokens=10, completion_tokens=5, queue_seconds=0.01, ttft_seconds=0.2, e2e_seconds=0.6,
    inter_token_seconds=(0.1, 0.1, 0.1, 0.1), price_usd=0.002, cost_usd=0.001, finished_at=1_700_000_000.0,
)


class FakeClock:
    def __init__(self, start: float = 10_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def outcome():
    """`outcome(**changes)`: the base outcome with fields replaced."""
    return lambda **changes: replace(BASE_OUTCOME, **changes)
