import math

import pytest

from api.routing.stats import mann_whitney_u, percentile, token_overlap, two_proportion_z


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([], 50, None),
    ([7.0], 95, 7.0),
    ([1, 2, 3, 4], 50, 2.5),
    ([1, 2, 3, 4], 95, 3.85),  # numpy.percentile's linear method
    ([4, 1, 3, 2], 0, 1),
    ([4, 1, 3, 2], 100, 4),
])
def test_percentile(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected) if expected is not None else percentile(values, q) is None


@pytest.mark.parametrize(("args", "z", "p"), [
    # statsmodels proportions_ztest([45, 60], [100, 100]): z -2.1240, p 0.03367
    ((45, 100, 60, 100), -2.1240, 0.03367),
    ((10, 50, 10, 50), 0.0, 1.0),
    ((5, 100, 0, 100), 2.2646, 0.02354),
])
def test_two_proportion_z(args, z, p):
    result = two_proportion_z(*args)
    assert result.statistic == pytest.approx(z, abs=1e-4)
    assert result.p_value == pytest.approx(p, abs=1e-4)


@pytest.mark.parametrize("args", [(0, 0, 1, 10), (0, 10, 0, 10), (10, 10, 5, 5)])
def test_two_proportion_z_undefined(args):
    assert two_proportion_z(*args) is None


@pytest.mark.parametrize(("a", "b", "u", "p"), [
    # scipy.stats.mannwhitneyu docs example, method="asymptotic": U 17.0, p 0.11134688653314041
    ([19, 22, 16, 29, 24], [20, 11, 17, 12], 17.0, 0.11134688653314041),
    # fully separated samples: U 0; z = (12.5 - 0.5) / sqrt(25 * 11 / 12)
    ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], 0.0, math.erfc(12 / math.sqrt(25 * 11 / 12) / math.sqrt(2))),
    # ties share ranks: ranks of a = 2, 2, 4.5 (U 2.5, mean 4.5); tie term 3^3-3 + 2^3-2 = 30; continuity 0.5
    ([1, 1, 2], [1, 2, 3], 2.5, math.erfc(1.5 / math.sqrt(9 / 12 * (7 - 30 / 30)) / math.sqrt(2))),
])
def test_mann_whitney_u(a, b, u, p):
    result = mann_whitney_u(a, b)
    assert result.statistic == pytest.approx(u)
    assert result.p_value == pytest.approx(p, rel=1e-9)


@pytest.mark.parametrize(("a", "b"), [([], [1.0]), ([2.0, 2.0], [2.0])])
def test_mann_whitney_u_undefined(a, b):
    assert mann_whitney_u(a, b) is None


@pytest.mark.parametrize(("a", "b", "overlap"), [
    ([], [], 1.0),
    ([1, 2, 3], [1, 2, 3], 1.0),
    ([1, 2, 3], [3, 2, 1], 1.0),  # a multiset, not positions
    ([1, 2, 3, 4], [1, 2], 0.5),
    ([1, 1, 2], [1, 2, 2], 2 / 3),
    ([5], [], 0.0),
])
def test_token_overlap(a, b, overlap):
    assert token_overlap(a, b) == pytest.approx(overlap)
