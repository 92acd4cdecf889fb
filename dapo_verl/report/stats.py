"""Paired comparison of two arms over seeds: the paired t-test, its interval, and the seeds a test needs.

An ablation trains every arm once per seed, with the same initial model and prompt order per seed, so the
natural unit is the per-seed difference d_i = (arm B) - (arm A). With n differences of mean m and sample
standard deviation s:

    t = m / (s / sqrt(n)),  df = n - 1,  p = 2 * (1 - F_t(|t|; df)),  95% CI = m -/+ t_{0.975, df} * s / sqrt(n)

(Student's paired t-test, two-sided). Seeds for a target power (:func:`seeds_for_power`): the normal
approximation n = ((z_{1-alpha/2} + z_{power}) * SD / delta)^2, refined by replacing the z quantiles with
t quantiles at df = n - 1 until n stops changing; delta and SD are the paired effect and its spread
estimated from a pilot.

The t distribution function is computed from the regularised incomplete beta function,
F_t(t; df) = 1 - I_{df / (df + t^2)}(df / 2, 1 / 2) / 2 for t >= 0, evaluated by its continued fraction
(modified Lentz method); quantiles by bisection. Pure Python (``math`` and ``statistics``), accurate to
about 1e-10 -- far below what a handful of seeds can resolve.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["PairedTest", "normalised_auc", "paired_t_test", "seeds_for_power", "t_cdf", "t_quantile"]

_EPS, _TINY = 1e-15, 1e-300


def _beta_continued_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of I_x(a, b) (modified Lentz), converging fast for x < (a + 1) / (a + b + 2)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            result *= c * d
        if abs(c * d - 1.0) < _EPS:
            break
    return result


def _regularised_beta(x: float, y: float, a: float, b: float) -> float:
    """I_x(a, b) for 0 <= x <= 1 with y = 1 - x given separately (it may be far more precise than 1 - x), a, b > 0."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(y, b, a) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function F_t(t; df).

    Example:
        >>> round(t_cdf(2.262157, 9), 6)  # the 97.5% point of t with 9 degrees of freedom
        0.975
    """
    if df <= 0:
        raise ValueError(f"df={df} must be positive (n - 1 for n paired differences, so n >= 2).")
    tail = 0.5 * _regularised_beta(df / (df + t * t), t * t / (df + t * t), df / 2.0, 0.5)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`).

    Example:
        >>> round(t_quantile(0.975, 4), 4)
        2.7764
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q={q} must lie in (0, 1).")
    low, high = -1.0, 1.0
    while t_cdf(low, df) > q:
        low *= 2.0
    while t_cdf(high, df) < q:
        high *= 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if t_cdf(middle, df) < q:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * max(1.0, abs(middle)):
            break
    return 0.5 * (low + high)


@dataclass(frozen=True)
class PairedTest:
    """Student's paired t-test of per-seed differences (module formula).

    Attributes:
        n: Pairs.
        mean: Mean difference.
        sd: Sample standard deviation of the differences (ddof=1).
        t: The t statistic (inf or -inf when every difference is the same non-zero value; 0 for all zeros).
        df: n - 1.
        p_value: Two-sided p-value.
        ci_low, ci_high: The two-sided ``confidence`` interval of the mean difference.
        confidence: The interval's level (0.95).
        better, same, worse: Pairs with a positive, zero and negative difference.
    """

    n: int
    mean: float
    sd: float
    t: float
    df: int
    p_value: float
    ci_low: float
    ci_high: float
    confidence: float
    better: int
    same: int
    worse: int

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (infinities as strings, which JSON lacks)."""
        return {k: (str(v) if isinstance(v, float) and math.isinf(v) else v) for k, v in asdict(self).items()}


def paired_t_test(differences: Sequence[float], *, confidence: float = 0.95) -> PairedTest:
    """Student's paired t-test (two-sided) and the interval of the mean of ``differences``.

    Raises:
        ValueError: for fewer than 2 differences, a non-finite one, or ``confidence`` outside (0, 1).

    Example:
        >>> test = paired_t_test([0.1, 0.2, 0.0, 0.3])
        >>> round(test.mean, 3), round(test.t, 3), round(test.p_value, 3), round(test.ci_low, 3)
        (0.15, 2.324, 0.103, -0.055)
    """
    values = [float(d) for d in differences]
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"a paired t-test needs at least 2 finite differences, got {values}; run more seeds.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence} must lie in (0, 1), e.g. 0.95.")
    n, mean, sd = len(values), statistics.fmean(values), statistics.stdev(values)
    df = n - 1
    half = t_quantile(0.5 + confidence / 2.0, df) * sd / math.sqrt(n)
    if sd > 0:
        t = mean / (sd / math.sqrt(n))
        p_value = min(1.0, 2.0 * (1.0 - t_cdf(abs(t), df)))
    else:
        t, p_value = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    return PairedTest(
        n=n,
        mean=mean,
        sd=sd,
        t=t,
        df=df,
        p_value=p_value,
        ci_low=mean - half,
        ci_high=mean + half,
        confidence=confidence,
        better=sum(v > 0 for v in values),
        same=sum(v == 0 for v in values),
        worse=sum(v < 0 for v in values),
    )


def seeds_for_power(effect: float, sd: float, *, alpha: float = 0.05, power: float = 0.8) -> int:
    """Pairs a two-sided paired t-test needs to detect ``effect`` with ``power`` at level ``alpha`` (module formula).

    Args:
        effect: The paired mean difference to detect (the pilot's), non-zero.
        sd: The standard deviation of the differences (the pilot's), > 0.
        alpha: Two-sided significance level.
        power: Target power.

    Returns:
        The smallest n >= 2 with n >= ((t_{1-alpha/2, n-1} + t_{power, n-1}) * sd / effect)^2.

    Raises:
        ValueError: for a zero or non-finite effect, a non-positive sd, or alpha/power outside (0, 1).

    Example:
        >>> seeds_for_power(0.5, 1.0)  # the normal approximation alone gives 32
        34
    """
    if not (math.isfinite(effect) and effect != 0):
        raise ValueError(
            f"effect={effect} must be a finite non-zero difference; a zero pilot effect needs no test "
            "to find it and no number of seeds to power one."
        )
    if not (math.isfinite(sd) and sd > 0):
        raise ValueError(f"sd={sd} must be a positive finite standard deviation of the paired differences.")
    for name, value in (("alpha", alpha), ("power", power)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{name}={value} must lie in (0, 1).")
    ratio = (sd / abs(effect)) ** 2
    normal = statistics.NormalDist()
    n = max(2, math.ceil((normal.inv_cdf(1 - alpha / 2) + normal.inv_cdf(power)) ** 2 * ratio))
    for _ in range(100):
        needed = max(2, math.ceil((t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)) ** 2 * ratio))
        if needed == n:
            break
        n = needed
    return n


def normalised_auc(steps: Sequence[float], values: Sequence[float]) -> float:
    """Area under a curve by the trapezoid rule, divided by its step range: the curve's time-average.

    Args:
        steps: At least two increasing steps (e.g. the evaluation steps 0, 5, ..., 40).
        values: The curve's value at each step.

    Raises:
        ValueError: for fewer than two points, steps that do not increase, or lengths that differ.

    Example:
        >>> normalised_auc([0, 5, 10], [0.0, 1.0, 1.0])  # (0.5 * 5 + 1.0 * 5) / 10
        0.75
    """
    if len(steps) != len(values) or len(steps) < 2:
        raise ValueError(
            f"an area under a curve needs at least two (step, value) points, got {len(steps)} steps and "
            f"{len(values)} values; evaluate at least twice (trainer.test_freq)."
        )
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise ValueError(f"steps {list(steps)} must increase.")
    area = sum((b - a) * (u + v) / 2 for (a, b), (u, v) in zip(itertools.pairwise(steps), itertools.pairwise(values)))
    return area / (steps[-1] - steps[0])
