"""Statistics of an A/B readout, pure: percentiles, the two-proportion z-test, the Mann-Whitney U test (normal
approximation with tie correction), and how alike two outputs are."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TestResult:
    statistic: float
    p_value: float


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _two_sided_p(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2))


def two_proportion_z(successes_a: int, n_a: int, successes_b: int, n_b: int) -> TestResult | None:
    """Pooled two-proportion z-test of p_a = p_b; None when a sample is empty or the pooled rate is 0 or 1."""
    if n_a == 0 or n_b == 0:
        return None
    pooled = (successes_a + successes_b) / (n_a + n_b)
    if pooled in (0.0, 1.0):
        return None
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    z = (successes_a / n_a - successes_b / n_b) / se
    return TestResult(z, _two_sided_p(z))


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> TestResult | None:
    """U of sample `a` and its two-sided p-value (normal approximation with tie and continuity corrections, as
    scipy's `mannwhitneyu(method="asymptotic")`); None when a sample is empty or every value is the same."""
    n_a, n_b = len(a), len(b)
    if n_a == 0 or n_b == 0:
        return None
    pooled = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks = [0.0] * len(pooled)
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    rank_sum_a = sum(rank for rank, (_, group) in zip(ranks, pooled) if group == 0)
    u = rank_sum_a - n_a * (n_a + 1) / 2
    n = n_a + n_b
    ties = sum(t ** 3 - t for t in Counter(v for v, _ in pooled).values())
    variance = n_a * n_b / 12 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:
        return None
    z = max(0.0, abs(u - n_a * n_b / 2) - 0.5) / math.sqrt(variance)
    return TestResult(u, min(1.0, _two_sided_p(z)))


def token_overlap(a: Sequence[int], b: Sequence[int]) -> float:
    """Shared tokens (as multisets) over the longer output; 1.0 for two empty outputs."""
    if not a and not b:
        return 1.0
    shared = sum((Counter(a) & Counter(b)).values())
    return shared / max(len(a), len(b))
