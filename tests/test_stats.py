"""aha.stats: intervals against hand-computed values."""

import math

import pytest

from aha.stats import bootstrap, difference_interval, is_gain, paired_gain, seed_interval, verdict, wilson


def test_wilson_by_hand():
    # 42 of 100, z = 1.959964: z^2 = 3.841459
    # centre = (0.42 + 3.841459/200) / (1 + 3.841459/100) = 0.439207/1.038415 = 0.422959
    # half   = 1.959964 * sqrt(0.42*0.58/100 + 3.841459/40000) / 1.038415
    #        = 1.959964 * sqrt(0.002436 + 0.0000960365) / 1.038415 = 0.098626 / 1.038415 = 0.094977
    lo, hi = wilson(42, 100)
    centre = (0.42 + 3.841459 / 200) / 1.03841459
    half = 1.959964 * math.sqrt(0.42 * 0.58 / 100 + 3.841459 / 40000) / 1.03841459
    assert lo == pytest.approx(centre - half, abs=1e-6) and hi == pytest.approx(centre + half, abs=1e-6)
    assert (round(lo, 4), round(hi, 4)) == (0.3280, 0.5179)  # 0.422959 -+ 0.094977


def test_wilson_edges_stay_inside_0_1():
    lo, hi = wilson(0, 20)      # no successes: lower bound exactly 0, upper z^2/(n+z^2) = 3.8415/23.8415
    assert lo == 0.0 and hi == pytest.approx(3.841459 / 23.841459, abs=1e-6)
    lo, hi = wilson(20, 20)
    assert hi == 1.0 and lo == pytest.approx(20 / 23.841459, abs=1e-6)
    assert all(math.isnan(x) for x in wilson(0, 0))


def test_bootstrap_of_a_constant_is_that_constant_and_is_reproducible():
    assert bootstrap([0.5] * 30) == (0.5, 0.5)
    values = [1.0] * 30 + [0.0] * 70
    assert bootstrap(values, seed=3) == bootstrap(values, seed=3)
    lo, hi = bootstrap(values)
    assert lo < 0.3 < hi and hi - lo == pytest.approx(2 * 1.96 * math.sqrt(0.3 * 0.7 / 100), abs=0.03)


def test_paired_gain_and_the_gain_rule():
    before, after = [0.0] * 100, [1.0] * 30 + [0.0] * 70
    gain, ci = paired_gain(before, after)
    assert gain == pytest.approx(0.3) and is_gain(ci)
    gain, ci = paired_gain([0.0, 1.0] * 50, [1.0, 0.0] * 50)  # as many lost as won: no gain
    assert gain == 0.0 and not is_gain(ci)
    assert (verdict((0.01, 0.2)), verdict((-0.1, 0.1)), verdict((-0.2, -0.01))) == ("gain", "=", "fell")


def test_seed_interval_by_hand():
    # 10, 20, 30: mean 20, sd 10, t(2) = 4.303 -> 20 -+ 4.303 * 10 / sqrt(3) = 20 -+ 24.843
    lo, hi = seed_interval([10.0, 20.0, 30.0])
    assert (round(lo, 3), round(hi, 3)) == (-4.843, 44.843)
    # 12 runs alternating 0 and 2: mean 1, sd sqrt(12/11); t(11) = 2.201 from the expansion (table value 2.2010)
    lo, hi = seed_interval([0.0, 2.0] * 6)
    assert hi - 1 == pytest.approx(2.201 * math.sqrt(12 / 11) / math.sqrt(12), abs=1e-3) and lo == pytest.approx(2 - hi)
    assert all(math.isnan(x) for x in seed_interval([5.0]))


def test_difference_interval_by_hand():
    # a = 2, 4, 6: mean 4, variance 4 -> 4/3 per mean; b = 1, 1, 1, 5: mean 2, variance 4 -> 1 per mean.
    # se = sqrt(7/3) = 1.5275; Welch df = (7/3)^2 / ((4/3)^2 / 2 + 1 / 3) = 4.45 -> 4, t = 2.776
    diff, (lo, hi) = difference_interval([2.0, 4.0, 6.0], [1.0, 1.0, 1.0, 5.0])
    assert diff == 2.0
    assert (round(lo, 3), round(hi, 3)) == (round(2 - 2.776 * math.sqrt(7 / 3), 3), round(2 + 2.776 * math.sqrt(7 / 3), 3))
    assert verdict(difference_interval([5.0, 5.1, 4.9], [1.0, 1.1, 0.9])[1]) == "gain"  # far apart: outside noise
    assert all(math.isnan(x) for x in difference_interval([1.0], [2.0, 3.0])[1])
