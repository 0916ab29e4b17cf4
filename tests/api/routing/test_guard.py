import pytest

from adapters.rollouts import RolloutGuard
from api.routing.guard import GuardWindow


@pytest.mark.parametrize(("guard", "seen", "now", "breached"), [
    # (at, server error, ttft)
    (RolloutGuard(max_error_rate=0.2, min_requests=5), [(0, True, None)] * 4, 1, False),  # below the minimum
    (RolloutGuard(max_error_rate=0.2, min_requests=5), [(0, True, None)] * 5, 1, True),
    (RolloutGuard(max_error_rate=0.2, min_requests=5), [(0, True, None)] + [(0, False, 0.1)] * 4, 1, False),  # 20%
    (RolloutGuard(max_error_rate=0.2, min_requests=5), [(0, True, None)] * 2 + [(0, False, 0.1)] * 3, 1, True),
    (RolloutGuard(max_error_rate=0.2, min_requests=5, window_s=10), [(0, True, None)] * 5, 11, False),  # aged out
    (RolloutGuard(max_ttft_p95_s=0.5, min_requests=3), [(0, False, 0.1), (0, False, 0.2), (0, False, 0.3)], 1, False),
    (RolloutGuard(max_ttft_p95_s=0.5, min_requests=3), [(0, False, 0.1), (0, False, 0.2), (0, False, 2.0)], 1, True),
])
def test_guard(guard, seen, now, breached):
    window = GuardWindow(guard)
    for at, error, ttft in seen:
        window.add(at, error, ttft)
    assert (window.breach(now) is not None) is breached
