"""The automatic rollback's judgement, pure: a canary's recent outcomes against its guard.

The window lives in memory (one per active rollout in this process); after a restart it fills again from new
traffic before it judges, which the guard's `min_requests` asks for anyway.
"""

from __future__ import annotations

from collections import deque

from adapters.rollouts import RolloutGuard
from api.routing.stats import percentile


class GuardWindow:
    def __init__(self, guard: RolloutGuard):
        self.guard = guard
        self._seen: deque[tuple[float, bool, float | None]] = deque()  # (finished at, server error, ttft)

    def add(self, at: float, server_error: bool, ttft_s: float | None) -> None:
        self._seen.append((at, server_error, ttft_s))

    def breach(self, now: float) -> str | None:
        """Why the candidate must be rolled back now, or None."""
        while self._seen and self._seen[0][0] < now - self.guard.window_s:
            self._seen.popleft()
        n = len(self._seen)
        if n < self.guard.min_requests:
            return None
        errors = sum(1 for _, error, _ in self._seen if error)
        if errors / n > self.guard.max_error_rate:
            return (f"error rate {errors / n:.0%} over the last {n} candidate requests is above "
                    f"{self.guard.max_error_rate:.0%}")
        if self.guard.max_ttft_p95_s is not None:
            p95 = percentile([t for _, _, t in self._seen if t is not None], 95)
            if p95 is not None and p95 > self.guard.max_ttft_p95_s:
                return f"TTFT p95 {p95:.3f}s over the last {n} candidate requests is above {self.guard.max_ttft_p95_s}s"
        return None
