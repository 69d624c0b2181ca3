"""tg.experiments.findings on the committed rows (results/mini/): the numbers notebook 05 prints, each checked
against the rows it comes from, and the lessons' helper that reads an evaluation's EM by hops."""

import pytest

from tg.experiments import findings
from tg.experiments.lesson import em_by_hops
from tg.experiments.summary import load_rows


def test_the_exploratory_edge_came_mostly_from_a_low_chain():
    side = findings.exploratory_vs_fresh().set_index(["start", "seeds"])
    hard = side.loc["hard"]
    assert hard.loc["exploratory", "seed range"] == "0-4" and hard.loc["fresh", "n"] == 12
    assert (round(hard.loc["exploratory", "chain"], 1), round(hard.loc["fresh", "chain"], 1)) == (17.5, 19.7)
    budget = load_rows("budget").query("step == 60 and setting == 'multi-hop' and regime == 'hard'")
    assert hard.loc["exploratory", "tree − chain"] == pytest.approx(
        budget[budget.method == "tree"].em_multi.mean() - budget[budget.method == "chain"].em_multi.mean())
    text = findings.winners_curse(findings.exploratory_vs_fresh())
    assert "hard start: tree − chain +3.1 EM points on seeds 0-4, -0.3 on the 12 fresh seeds; the chain moved most: " \
           "17.5 on seeds 0-4 against 19.7 on the fresh seeds" in text


def test_most_groups_carry_no_signal_and_a_tree_adds_a_little_early():
    shares = findings.signal_shares().set_index(["start", "window"])
    none = 1 - shares["chain: share with signal"]
    assert none.between(0.7, 0.9).all()
    early = shares.xs("steps 1-30", level="window")["extra prompts per step"]
    late = shares.xs("steps 31-60", level="window")["extra prompts per step"]
    assert early.between(0.5, 0.9).all() and (late.abs() < 0.2).all()


def test_the_two_agents_mostly_score_alike_and_the_papers_budget_2_gain_is_excluded():
    agree = findings.agreement()
    assert set(agree.start) == {"hard", "moderate"} and (agree.seeds == 12).all()
    assert agree["same outcome"].between(0.9, 1.0).all() and (agree["min"] <= agree["same outcome"]).all()
    gain = findings.paper_gain_here(budget=2)
    assert gain["paper gain"].round(2).eq(1.12).all()                                   # Table 3: 31.6 / 14.9 - 1
    assert (gain["95% CI high"] < gain["paper gain here (EM points)"]).all() and (gain.seeds == 5).all()


class _Eval:
    def by_source(self):
        return {"synthetic_multi": 0.25, "synthetic_single": 0.375}   # sorted by name: multi-hop comes first


def test_em_by_hops_reads_the_multi_hop_column_by_name():
    assert em_by_hops(_Eval()) == {"single": 0.375, "multi": 0.25}
    assert list(_Eval().by_source())[-1] == "synthetic_single"   # what the last column was: single-hop
