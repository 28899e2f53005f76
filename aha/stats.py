"""95% intervals for the accuracies aha reports: Wilson for a proportion, a bootstrap over problems otherwise.

A gain is called a gain only when its interval excludes 0 (`is_gain`): on 200 problems a 5-point
difference is inside the noise.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Callable, Sequence

Z95 = 1.959964
"""Standard normal quantile for a two-sided 95% interval."""
BOOTSTRAP_SAMPLES = 2000
"""Resamples per bootstrap interval: the 2.5% / 97.5% quantiles move by well under a point at this size."""


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion.

    Example: 42 of 100 -> (0.3280, 0.5179): centre (0.42 + 1.9207/100) / 1.038415 = 0.4230, half-width
    1.96 * sqrt(0.42*0.58/100 + 0.9604/10000) / 1.038415 = 0.0950.
    """
    if n <= 0:
        return (math.nan, math.nan)
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap(values: Sequence, statistic: Callable[[list], float] = None, seed: int = 0,
              samples: int = BOOTSTRAP_SAMPLES) -> tuple[float, float]:
    """Percentile 95% interval of `statistic` (default: the mean) over problems resampled with replacement."""
    if not values:
        return (math.nan, math.nan)
    stat = statistic or (lambda xs: sum(xs) / len(xs))
    rng = random.Random(seed)
    draws = sorted(stat([values[rng.randrange(len(values))] for _ in values]) for _ in range(samples))
    return (draws[int(0.025 * samples)], draws[min(samples - 1, int(0.975 * samples))])


def paired_gain(before: Sequence[float], after: Sequence[float], seed: int = 0) -> tuple[float, tuple[float, float]]:
    """Mean of after - before on the same problems, and its bootstrap 95% interval (paired: each problem
    is resampled with both of its results, so problem difficulty cancels)."""
    assert len(before) == len(after), (len(before), len(after))
    diffs = [a - b for a, b in zip(after, before)]
    return sum(diffs) / max(len(diffs), 1), bootstrap(diffs, seed=seed)


T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
"""Student t 0.975 quantiles by degrees of freedom (beyond 10: the Cornish-Fisher expansion in `_t975`)."""


def _t975(df: float) -> float:
    """Student t 0.975 quantile: the table up to 10 degrees of freedom (a fractional df there rounds down, the
    wider interval), the Cornish-Fisher expansion above."""
    if df < 1:
        return math.nan
    if df <= 10:
        return T975[int(df)]
    return Z95 + (Z95 ** 3 + Z95) / (4 * df) + (5 * Z95 ** 5 + 16 * Z95 ** 3 + 3 * Z95) / (96 * df * df)


def seed_interval(values: Sequence[float]) -> tuple[float, float]:
    """Student t 95% interval of the mean of one figure over independent runs (seeds): what another seed's
    runs would average to. Two runs give an interval, but a wide one (t = 12.7)."""
    n = len(values)
    if n < 2:
        return (math.nan, math.nan)
    mean, sd = statistics.mean(values), statistics.stdev(values)
    t = _t975(n - 1)
    return (mean - t * sd / math.sqrt(n), mean + t * sd / math.sqrt(n))


def difference_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """mean(a) - mean(b) over two sets of independent runs (say, two trainers' seeds) and its Welch 95%
    interval (unequal variances, Welch-Satterthwaite degrees of freedom). Each set needs two runs."""
    if len(a) < 2 or len(b) < 2:
        return statistics.mean(a) - statistics.mean(b) if a and b else math.nan, (math.nan, math.nan)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff, se = statistics.mean(a) - statistics.mean(b), math.sqrt(va + vb)
    if se == 0:
        return diff, (diff, diff)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    t = _t975(df)
    return diff, (diff - t * se, diff + t * se)


def is_gain(interval: tuple[float, float]) -> bool:
    """True when the whole interval lies above 0."""
    return interval[0] > 0


def verdict(interval: tuple[float, float]) -> str:
    """"gain" or "fell" when the interval of a change lies wholly above or below 0, "=" otherwise."""
    return "gain" if is_gain(interval) else "fell" if interval[1] < 0 else "="
