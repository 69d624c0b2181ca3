"""Verdicts by a declared rule: paired differences, paired t-tests, Holm's correction, a two-look boundary.

The claims table (`tg.experiments.claims`) compares two cells of a grid seed by seed (the same seed gives both cells the
same question order), so each comparison is a list of paired differences d_1..d_n. For each:

    effect = mean(d),  se = sd(d) / sqrt(n),  t = effect / se,  p = P(|T_{n-1}| >= |t|)   (two-sided)

and over the whole family of m comparisons Holm's step-down correction (Holm 1979) adjusts the p-values so
that the chance of any false "holds" in the family stays below alpha. A comparison's verdict:

- "holds": adjusted p < alpha and the effect has the paper's sign;
- "opposite": adjusted p < alpha and the effect has the other sign;
- "not shown": otherwise (a difference this test cannot tell from seed noise; not a shown absence).

This module keeps the rules; the arithmetic is scipy's (`scipy.stats.ttest_1samp`, the t and normal distributions,
the bivariate normal CDF) and statsmodels' (`multipletests`, Holm). The confirmatory experiment's two-look rule
(`tg.experiments.confirm`) uses `one_sided_test` and `two_look_levels`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import optimize, stats
from statsmodels.stats.multitest import multipletests

ALPHA = 0.05
"""The family-wise error rate of the verdicts (Holm-adjusted p below it)."""


def t_critical(alpha: float, df: int) -> float:
    """The t with P(|T| >= t) = alpha on `df` degrees of freedom (e.g. 2.776 for alpha 0.05 and df 4)."""
    return float(stats.t.isf(alpha / 2, df))


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
    d = np.asarray(diffs, dtype=float)
    mean, se = float(d.mean()), float(stats.sem(d))
    if se == 0:  # scipy's t is undefined here; the rule: a constant non-zero difference is certain
        return PairedTest(n=n, effect=mean, se=0.0, p=1.0 if mean == 0 else 0.0, ci_low=mean, ci_high=mean)
    r = stats.ttest_1samp(d, 0.0)
    ci = r.confidence_interval(0.95)
    return PairedTest(n=n, effect=mean, se=se, p=float(r.pvalue), ci_low=float(ci.low), ci_high=float(ci.high))


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given (statsmodels' `multipletests`, as R's
    p.adjust(p, "holm")): a comparison holds at family-wise level alpha exactly where its adjusted p < alpha."""
    return [float(x) for x in multipletests(list(p), method="holm")[1]] if len(p) else []


@dataclass(frozen=True)
class OneSidedTest:
    """A one-sided t-test of mean(d) > 0 at a nominal level, and the upper confidence bound at that level."""

    n: int
    effect: float
    se: float
    p: float
    """one-sided p of mean(d) > 0"""
    upper: float
    """the one-sided (1 - level) upper confidence bound of mean(d)"""
    ci_low: float
    ci_high: float
    """the two-sided 95% t interval (reported; the rule reads `p` and `upper`)"""


def one_sided_test(diffs: Sequence[float], level: float) -> OneSidedTest:
    """`scipy.stats.ttest_1samp` of `diffs` with H1: mean > 0, and the upper bound of the one-sided interval at
    confidence 1 - `level` (mean(d) < bound); n >= 2 and not all equal."""
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2 or float(stats.sem(d)) == 0:
        raise ValueError(f"a t-test needs at least 2 differences that are not all equal, got {d.tolist()}")
    greater = stats.ttest_1samp(d, 0.0, alternative="greater")
    upper = stats.ttest_1samp(d, 0.0, alternative="less").confidence_interval(1 - level).high
    ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
    return OneSidedTest(n=len(d), effect=float(d.mean()), se=float(stats.sem(d)), p=float(greater.pvalue),
                        upper=float(upper), ci_low=float(ci.low), ci_high=float(ci.high))


def obrien_fleming_spent(fraction: float, alpha: float) -> float:
    """Lan and DeMets' O'Brien-Fleming-type spending function: the one-sided alpha spent once a share `fraction`
    of the planned information is in, 2 - 2 Phi(z_{alpha/2} / sqrt(fraction)) (alpha at fraction 1)."""
    return float(2 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(fraction)))


def two_look_levels(n1: int, n2: int, alpha: float = ALPHA) -> tuple[float, float]:
    """The nominal one-sided levels (a1, a2) of a test looked at with n1 and then n2 seeds: a1 is the
    O'Brien-Fleming-type spending at n1 / n2, and a2 makes the chance of crossing at either look alpha, with the
    two looks' z statistics jointly normal with correlation sqrt(n1 / n2) (scipy's bivariate normal CDF)."""
    if not 1 <= n1 < n2:
        raise ValueError(f"two looks need 1 <= n1 < n2, got n1 = {n1}, n2 = {n2}")
    a1 = obrien_fleming_spent(n1 / n2, alpha)
    c1, rho = stats.norm.isf(a1), math.sqrt(n1 / n2)
    joint = stats.multivariate_normal(mean=[0.0, 0.0], cov=[[1.0, rho], [rho, 1.0]], abseps=1e-10, releps=1e-10, seed=0)
    def excess(c2: float) -> float:  # P(Z1 < c1, Z2 >= c2) - (alpha - a1)
        return stats.norm.cdf(c1) - joint.cdf([c1, c2]) - (alpha - a1)
    c2 = optimize.brentq(excess, 0.0, c1 + 5.0, xtol=1e-12)
    return a1, float(stats.norm.sf(c2))


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
