import pytest

from api.routing.breaker import Breakers, BreakerState, CircuitBreaker


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize(("events", "state", "allowed"), [
    ("", BreakerState.CLOSED, True),
    ("ff", BreakerState.CLOSED, True),
    ("fff", BreakerState.OPEN, False),
    ("ffsff", BreakerState.CLOSED, True),  # a success resets the count
    ("fff+", BreakerState.HALF_OPEN, True),  # + : the open period passes
    ("fff+s", BreakerState.CLOSED, True),
    ("fff+f", BreakerState.OPEN, False),  # the probe failed: open again
    ("fff+f+", BreakerState.HALF_OPEN, True),
    ("fff+a", BreakerState.HALF_OPEN, True),  # a: the probe ended without a verdict; the next one may probe
])
def test_breaker_states(events, state, allowed):
    clock = Clock()
    breaker = CircuitBreaker(failures=3, open_s=30, clock=clock)
    for event in events:
        if event == "f":
            breaker.failure()
        elif event == "s":
            breaker.success()
        elif event == "a":
            assert breaker.allow()
            breaker.abandon()
        else:
            clock.now += 30
    assert breaker.state is state
    assert breaker.allow() is allowed


def test_half_open_lets_one_probe_through_at_a_time():
    clock = Clock()
    breaker = CircuitBreaker(failures=1, open_s=5, clock=clock)
    breaker.failure()
    assert not breaker.allow()
    clock.now += 5
    assert breaker.allow()
    assert not breaker.allow()  # the probe is out
    breaker.success()
    assert breaker.allow() and breaker.allow()
    assert breaker.opened == 1


def test_breakers_are_per_label():
    breakers = Breakers(failures=1, open_s=5, clock=Clock())
    breakers.of("a@2").failure()
    assert breakers.states() == {"a@2": BreakerState.OPEN}
    assert breakers.of("a@1").allow()


@pytest.mark.parametrize(("failures", "open_s"), [(0, 1), (1, -1)])
def test_bad_thresholds(failures, open_s):
    with pytest.raises(ValueError):
        CircuitBreaker(failures, open_s)
