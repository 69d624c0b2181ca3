"""Verdicts by a declared rule (tg.experiments.verdict): the paired t-test and Holm's correction against reference
values and their properties."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tg.experiments.verdict import claim_verdict, holm, paired_test, t_critical, verdict


pytestmark = pytest.mark.usefixtures("no_gc_collect")  # Holm, called here 30+ times (tests/conftest.py)


# Student's sleep data (R's datasets::sleep): extra hours of sleep of 10 patients under drug 1 and drug 2.
DRUG1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_paired_test_matches_r_on_the_sleep_data():
    """R: t.test(extra ~ group, data = sleep, paired = TRUE) prints t = -4.0621, df = 9, p-value = 0.002833,
    95 percent confidence interval -2.4598858 -0.7001142, mean difference -1.58."""
    r = paired_test([a - b for a, b in zip(DRUG1, DRUG2)])
    assert r.n == 10 and r.effect == pytest.approx(-1.58)
    assert r.effect / r.se == pytest.approx(-4.0621, abs=5e-5)
    assert r.p == pytest.approx(0.002833, abs=5e-7)
    assert (r.ci_low, r.ci_high) == (pytest.approx(-2.4598858, abs=5e-8), pytest.approx(-0.7001142, abs=5e-8))


def test_t_critical_values_of_the_tables():
    """R's qt(0.975, df) and qt(0.995, 4); with many degrees of freedom the normal's 1.959964."""
    assert t_critical(0.05, 4) == pytest.approx(2.776445, abs=1e-6)
    assert t_critical(0.05, 9) == pytest.approx(2.262157, abs=1e-6)
    assert t_critical(0.01, 4) == pytest.approx(4.604095, abs=1e-6)
    assert t_critical(0.05, 5001) == pytest.approx(1.959964, abs=1e-3)


def test_paired_test_of_equal_differences_and_too_few():
    assert (paired_test([2.0, 2.0, 2.0]).se, paired_test([2.0, 2.0, 2.0]).p) == (0.0, 0.0)
    assert paired_test([0.0, 0.0]).p == 1.0
    with pytest.raises(ValueError):
        paired_test([1.0])


def test_holm_on_a_worked_example():
    """Sorted p 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04; the running maximum makes the
    last 0.06 (step-down: once a hypothesis is kept, every larger p is kept). Returned in the given order."""
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.2, 0.5]) == pytest.approx([0.4, 0.5]) and holm([0.7]) == [0.7] and holm([]) == []
    assert holm([0.3, 0.4, 0.9]) == pytest.approx([0.9, 0.9, 0.9]) and holm([0.4, 0.5, 0.6]) == [1.0, 1.0, 1.0]  # cap


@settings(max_examples=30)
@given(st.lists(st.floats(min_value=0, max_value=1), min_size=1, max_size=30))
def test_holm_adjusted_p_are_at_least_raw_at_most_one_and_in_the_raw_order(p):
    adjusted = holm(p)
    assert all(raw <= adj <= 1 for raw, adj in zip(p, adjusted))
    pairs = sorted(zip(p, adjusted))
    assert all(a[1] <= b[1] for a, b in zip(pairs, pairs[1:]))


def test_verdict_rules():
    assert verdict(2.0, 0.01, +1) == "holds" and verdict(-2.0, 0.01, -1) == "holds"
    assert verdict(-2.0, 0.01, +1) == "opposite" and verdict(2.0, 0.05, +1) == "not shown"
    assert claim_verdict(["holds", "holds"]) == "holds"
    assert claim_verdict(["holds", "not shown"]) == "partly"
    assert claim_verdict(["opposite", "not shown"]) == "opposite"
    assert claim_verdict(["holds", "opposite"]) == "mixed"
    assert claim_verdict(["not shown", "not run"]) == "not shown"
    assert claim_verdict(["not run", "not run"]) == "not run"
