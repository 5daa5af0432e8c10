"""Statistics of the learning benchmarks: Welch's unequal-variance t-test on two sets of per-seed results.

Our own (pure Python) rather than scipy's ``ttest_ind(equal_var=False)``: scipy is in neither the project's
dependencies nor the TRL venv the benchmarks run in, and these few lines are checked against values computed by
hand and against the t distribution's closed forms (tests/unit/test_bench_stats.py; against scipy too where it is
installed).
"""

from __future__ import annotations

import math
import statistics


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method; Abramowitz & Stegun 26.5.8)."""
    tiny, eps = 1e-300, 3e-16
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x={x} is outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast on this side; the symmetry on the other
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` (> 0, not necessarily whole) degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df={df} must be > 0")
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Welch's t-test of mean(a) against mean(b): (t, Welch-Satterthwaite df, two-sided p). Needs two values in
    each; equal values on both sides (no variance at all) give t = +-inf, p = 0 when the means differ, else
    t = 0, p = 1."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's test needs at least two values per side")
    return welch_summary(statistics.fmean(a), statistics.stdev(a), len(a),
                         statistics.fmean(b), statistics.stdev(b), len(b))


def welch_summary(mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int
                  ) -> tuple[float, float, float]:
    """:func:`welch` from each side's mean, sample standard deviation and count, for a row whose per-seed values are
    no longer at hand (a table's mean ± sd)."""
    va, vb = sd_a ** 2 / n_a, sd_b ** 2 / n_b
    diff = mean_a - mean_b
    if va + vb == 0:
        return (0.0, math.nan, 1.0) if diff == 0 else (math.copysign(math.inf, diff), math.nan, 0.0)
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1))
    return t, df, t_two_sided_p(t, df)


def smallest_mean_ahead(sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int, alpha: float = 0.05) -> float:
    """The smallest mean of side a, at its sample standard deviation and count, that Welch's two-sided test puts
    above ``mean_b`` with p < ``alpha`` (the bound itself has p = ``alpha``): how far a row is from being ahead beyond
    noise at the spreads its seeds showed. The standard error and the df do not depend on the means, so this inverts
    the t tail alone (bisection on :func:`t_two_sided_p`)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha} is outside (0, 1)")
    if sd_a == sd_b == 0:
        return mean_b  # no spread on either side: any larger mean is ahead (p = 0)
    _, df, _ = welch_summary(mean_b, sd_a, n_a, mean_b, sd_b, n_b)  # Welch's df, whatever the means
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > alpha:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > alpha else (lo, mid)
    return mean_b + hi * math.sqrt(sd_a ** 2 / n_a + sd_b ** 2 / n_b)


def sds_from_welch(mean_a: float, mean_b: float, t: float, df: float, n: int) -> tuple[float, float]:
    """The two sample standard deviations, larger first, behind a printed Welch line of two sides of ``n`` values each
    (its means, t and df): the line fixes the sum of the two variances (through t) and the sum of their squares
    (through df), so the pair, not which side has which; another line that tests one of the two sides against a
    third row tells them apart."""
    total = n * ((mean_a - mean_b) / t) ** 2  # x + y, the two variances
    squares = (n - 1) * total ** 2 / df  # x^2 + y^2
    spread = math.sqrt(max(2 * squares - total ** 2, 0.0))  # x - y
    return math.sqrt((total + spread) / 2), math.sqrt(max((total - spread) / 2, 0.0))
