"""Verdicts by a declared rule: paired differences, a paired t-test, Holm's correction (pure, stdlib only).

The claims table (`tg.experiments.claims`) compares two cells of a grid seed by seed (the same seed gives both cells the
same question order), so each comparison is a list of paired differences d_1..d_n. For each:

    effect = mean(d),  se = sd(d) / sqrt(n),  t = effect / se,  p = P(|T_{n-1}| >= |t|)   (two-sided)

and over the whole family of m comparisons Holm's step-down correction (Holm 1979) adjusts the p-values so
that the chance of any false "holds" in the family stays below alpha. A comparison's verdict:

- "holds": adjusted p < alpha and the effect has the paper's sign;
- "opposite": adjusted p < alpha and the effect has the other sign;
- "not shown": otherwise (a difference this test cannot tell from seed noise; not a shown absence).

The t distribution's CDF is computed exactly in closed form for integer degrees of freedom (Abramowitz &
Stegun 26.7.3 and 26.7.4), which a paired test always has, so no special-function library is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

ALPHA = 0.05
"""The family-wise error rate of the verdicts (Holm-adjusted p below it)."""


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with integer `df` >= 1 degrees of freedom.

    With theta = atan(|t| / sqrt(df)), P(|T| < |t|) is a finite series in cos(theta) (Abramowitz & Stegun
    26.7.3 for odd df, 26.7.4 for even); exact up to float round-off (absolute error about 1e-16)."""
    if df < 1 or df != int(df):
        raise ValueError(f"df must be a positive integer, got {df}")
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)), (df - 1) / 2 terms
        series, term = 0.0, c
        for j in range(1, (df - 1) // 2 + 1):
            series += term
            term *= c * c * (2 * j) / (2 * j + 1)
        inside = 2 / math.pi * (theta + s * series)
    else:       # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...), df / 2 terms
        series, term = 0.0, 1.0
        for j in range(1, df // 2 + 1):
            series += term
            term *= c * c * (2 * j - 1) / (2 * j)
        inside = s * series
    return min(1.0, max(0.0, 1.0 - inside))


def t_critical(alpha: float, df: int) -> float:
    """The t with P(|T| >= t) = alpha (e.g. 2.776 for alpha 0.05 and df 4), by bisection on `t_two_sided_p`."""
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > alpha:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > alpha else (lo, mid)
        if hi - lo < 1e-13 * hi:
            break
    return (lo + hi) / 2


@dataclass(frozen=True)
class PairedTest:
    """A paired t-test of differences d_1..d_n (cell minus reference, one per seed)."""

    n: int
    effect: float
    """mean(d)"""
    se: float
    """sd(d) / sqrt(n), sd with n - 1 in the denominator"""
    p: float
    """two-sided p of t = effect / se on n - 1 degrees of freedom"""
    ci_low: float
    ci_high: float
    """the 95% confidence interval of the mean difference: effect -/+ t_critical(0.05, n - 1) se"""


def paired_test(diffs: Sequence[float]) -> PairedTest:
    """The paired t-test of `diffs` (n >= 2). All differences equal: se 0, p 0 unless they are all 0 (p 1)."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"a paired test needs at least 2 differences, got {n}")
    mean = math.fsum(diffs) / n
    se = math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1) / n)
    if se == 0:
        p = 1.0 if mean == 0 else 0.0
    else:
        p = t_two_sided_p(mean / se, n - 1)
    half = t_critical(0.05, n - 1) * se
    return PairedTest(n=n, effect=mean, se=se, p=p, ci_low=mean - half, ci_high=mean + half)


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: with p sorted ascending p_(1) <= ... <= p_(m),
    adjusted p_(i) = max over j <= i of min(1, (m - j + 1) p_(j)). A comparison holds at family-wise level alpha
    exactly where its adjusted p < alpha (as R's p.adjust(p, "holm"))."""
    m = len(p)
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda k: p[k])):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def verdict(effect: float, p_adjusted: float, sign: int, alpha: float = ALPHA) -> str:
    """'holds', 'opposite' or 'not shown' (module docstring); `sign` is the paper's direction, +1 or -1."""
    if p_adjusted >= alpha or effect == 0:
        return "not shown"
    return "holds" if (effect > 0) == (sign > 0) else "opposite"


def claim_verdict(parts: Sequence[str]) -> str:
    """A claim made of several comparisons: 'holds' if every part holds, 'partly' if some hold and none is
    opposite, 'opposite' if some are opposite and none holds, 'mixed' if some hold and some are opposite,
    'not shown' if none holds and none is opposite; 'not run' if no part has rows yet."""
    if parts and all(p == "not run" for p in parts):
        return "not run"
    held, against = parts.count("holds"), parts.count("opposite")
    if held == len(parts) and parts:
        return "holds"
    if held and against:
        return "mixed"
    return "partly" if held else "opposite" if against else "not shown"
