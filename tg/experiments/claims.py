"""The claims table: the declared family of comparisons, their verdicts by rule, and the generated tables.

`FAMILY` lists, in one place, every comparison the claims table makes: which grid, which start, which cell
minus which reference cell (paired by seed at the final evaluation step), which metric, and the paper's
direction. `tg.experiments.verdict` turns each into a paired t-test and corrects the family's p-values with Holm's
method; claims 1 and 7 are counts and an identity, decided by their own rules (`ledger_rule`, `theory_rule`).
`tg mini report --readme` writes the tables between the markers of README.md and results/mini/README.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import pandas as pd

from tg.experiments.verdict import ALPHA, PairedTest, claim_verdict, holm, paired_test, t_critical, verdict

FINAL_STEP = 60
"""The evaluation step every comparison reads (the cpu preset's last, `tg.experiments.cells.POINTS`)."""
THEORY_TOLERANCE = 1e-10
"""Claim 7 holds if every |difference| of Proposition 3.1's three forms is below this (float64 gradients)."""
REGIMES = ("hard", "moderate")
UNITS = {"em_multi": "multi-hop EM", "em_single": "single-hop EM", "calls_multi": "searches / multi-hop q"}
"""The metrics comparisons read: EM in points of the 300 multi-hop or 150 single-hop test questions, and
searches per multi-hop test question."""

CLAIMS: dict[int, str] = {
    1: "a tree buys more trajectories per budget, with fewer tokens and searches per trajectory",
    2: "at equal budget Tree-GRPO beats chain GRPO, by more on multi-hop than on single-hop",
    3: "the tree's edge holds at budgets 2, 4, 8, 16; the tree at ≈4 is above the chain at ≈16",
    4: "intra-tree only fails at 3 leaves, not at 7; inter-tree only beats the chain; intra + inter is best",
    5: "at a fixed budget too small an M hurts; (2,2,1) is the best budget-4 shape",
    6: "tree-trained agents search more",
    7: "Proposition 3.1: intra-tree GRPO's gradient is p(win) times step-level DPO's",
}
"""The paper's claims (docs/paper.md#claims), in the words of the claims table."""


@dataclass(frozen=True)
class Comparison:
    """Cell minus reference in one grid, start and setting, paired by seed at `FINAL_STEP`; with `minus`, this
    difference minus that comparison's, seed by seed (a difference of differences)."""

    claims: tuple[int, ...]
    grid: str
    regime: str
    cell: str
    """the last part of the cell's name in the grid's CSV (e.g. 'tree (2,2,1)')"""
    reference: str
    sign: int = 1
    """the paper's direction: +1 the cell above the reference, -1 below"""
    metric: str = "em_multi"
    """a column of the rows: em_multi, em_single (EM points) or calls_multi (searches per multi-hop question)"""
    setting: str = "multi-hop"
    minus: Comparison | None = None

    def label(self) -> str:
        """The comparison in words with the paper's side, e.g. 'tree − chain, multi-hop EM (> 0)'."""
        text = f"{self.cell} − {self.reference}, {UNITS[self.metric]}"
        if self.minus:
            text = f"({text}) − ({self.minus.label().rpartition(' (')[0]})"
        return f"{text} ({'>' if self.sign > 0 else '<'} 0)"


def _both(claims: tuple[int, ...], grid: str, cell: str, reference: str, sign: int = 1,
          metric: str = "em_multi") -> list[Comparison]:
    return [Comparison(claims, grid, r, cell, reference, sign, metric) for r in REGIMES]


_SINGLE = Comparison((2,), "budget", "moderate", "tree", "chain", metric="em_single", setting="single-hop")
FAMILY: list[Comparison] = [
    *_both((2, 3), "budget", "tree", "chain"),        # the ≈4 pair; shapes, ablation and sweep copy these runs
    _SINGLE,
    Comparison((2,), "budget", "moderate", "tree", "chain", minus=_SINGLE),
    *_both((3,), "sweep", "tree (1,2,1)", "chain-2"),
    *_both((3,), "sweep", "tree (4,2,1)", "chain-8"),
    *_both((3,), "sweep", "tree (8,2,1)", "chain-16"),
    *_both((3,), "sweep", "tree (2,2,1)", "chain-16"),  # the quarter budget: a CI, no equivalence margin
    *_both((4,), "ablation", "intra (2,2,1)", "chain", sign=-1),
    *_both((4,), "ablation", "intra (2,6,1)", "chain-8"),
    *_both((4,), "ablation", "inter (2,2,1)", "chain"),
    *_both((4,), "ablation", "intra+inter (2,2,1)", "inter (2,2,1)"),
    *_both((4,), "ablation", "intra+inter (2,2,1)", "intra (2,2,1)"),
    *_both((5,), "shapes", "(1,5,1)", "(2,2,1)", sign=-1),
    *_both((5,), "shapes", "(2,1,2)", "(2,2,1)", sign=-1),
    *_both((6,), "budget", "tree", "chain", metric="calls_multi"),
]
"""Every comparison of the claims table, each once: Holm's correction runs over all of them together."""

BRANCHING: list[Comparison] = [
    *_both((), "branching", "chain+steps", "chain"),    # GiGPO: step groups give chains step-level signal
    *_both((), "branching", "tree", "chain"),            # Tree-GRPO (random nodes), the budget grid's pair
    *_both((), "branching", "tree-entropy", "tree"),     # ARPO / AEPO / TreeRL: branch where the policy is unsure
]
"""Beyond the paper's claims: where to branch, at equal budget (results/mini/README.md, protocol). Its own
family: Holm's correction runs over these six, apart from the claims table's."""


@dataclass(frozen=True)
class Result:
    """A comparison's test (None where its grid has no rows for it yet), Holm-adjusted p and verdict."""

    comparison: Comparison
    test: PairedTest | None
    p_holm: float
    verdict: str
    mixed: int = 0
    """pairs whose two runs were trained on different CPU kinds (`mixed_pairs`)"""


def differences(rows: pd.DataFrame, c: Comparison) -> pd.Series:
    """Cell minus reference at `FINAL_STEP`, one value per seed both have (index: seed)."""
    at = rows[rows["step"] == FINAL_STEP]
    def metric(cell: str) -> pd.Series:
        return at[at["cell"] == f"{c.setting}/{c.regime}/{cell}"].set_index("seed")[c.metric].astype(float)
    d = (metric(c.cell) - metric(c.reference)).dropna()
    return (d - differences(rows, c.minus)).dropna() if c.minus else d


def mixed_pairs(rows: pd.DataFrame, c: Comparison) -> int:
    """How many seeds' cell and reference rows at `FINAL_STEP` were made on different CPU kinds (`machine`): floats
    depend on the kind, so such a pair confounds the machine with the cell."""
    if "machine" not in rows:
        return 0
    at = rows[rows["step"] == FINAL_STEP]
    def kind(cell: str) -> pd.Series:
        return at[at["cell"] == f"{c.setting}/{c.regime}/{cell}"].set_index("seed")["machine"].astype(str)
    both = pd.concat([kind(c.cell), kind(c.reference)], axis=1).dropna()
    return int((both.iloc[:, 0] != both.iloc[:, 1]).sum()) + (mixed_pairs(rows, c.minus) if c.minus else 0)


def evaluate(frames: Mapping[str, pd.DataFrame], family: list[Comparison] = FAMILY) -> list[Result]:
    """Test every comparison of `family` on the rows of its grid (`frames`: grid name -> rows), correct the
    p-values over the whole family (Holm; a comparison without two paired seeds counts with p = 1) and give
    each its verdict ('not run' where it has no test)."""
    tests = []
    for c in family:
        d = differences(frames[c.grid], c) if c.grid in frames else pd.Series(dtype=float)
        tests.append(paired_test(d.tolist()) if len(d) >= 2 else None)
    adjusted = holm([t.p if t else 1.0 for t in tests])
    return [Result(c, t, p, verdict(t.effect, p, c.sign) if t else "not run",
                   mixed_pairs(frames[c.grid], c) if c.grid in frames and t else 0)
            for c, t, p in zip(family, tests, adjusted)]


def ledger_rule(ledger: pd.DataFrame) -> tuple[str, str]:
    """Claim 1's rule: every (start, seed, tree shape) row has more trajectories per question than the chain of
    its budget in the same start and seed, and fewer generated tokens and fewer searches per trajectory.
    Returns (what the rows show, 'holds' or 'not shown')."""
    from tg.budget import matched_chain_group
    keyed = ledger.set_index(["regime", "seed", "M", "N", "L"])
    trees = ledger[ledger["N"] > 0]
    ratios = {col: [] for col in ("trajectories_per_q", "generated_per_traj", "calls_per_traj")}
    for r in trees.itertuples():
        chain = keyed.loc[(r.regime, r.seed, matched_chain_group(r.M, r.N, r.L), 0, 0)]
        for col, values in ratios.items():
            values.append(getattr(r, col) / chain[col])
    ok = (min(ratios["trajectories_per_q"]) > 1 and max(ratios["generated_per_traj"]) < 1
          and max(ratios["calls_per_traj"]) < 1)
    span = {col: f"{min(v):.2f}-{max(v):.2f}x" for col, v in ratios.items()}
    return (f"{len(trees)} (start, seed, tree) rows against their chain: trajectories {span['trajectories_per_q']}, "
            f"tokens / trajectory {span['generated_per_traj']}, searches / trajectory {span['calls_per_traj']}",
            "holds" if ok else "not shown")


def theory_rule(theory: pd.DataFrame) -> tuple[str, str]:
    """Claim 7's rule: the largest |difference| over all toy trees and the three forms is below
    `THEORY_TOLERANCE`. Returns (what the rows show, 'holds' or 'not shown')."""
    worst = float(theory[["intra_err", "dpo_err", "ratio_err"]].to_numpy().max())
    return (f"largest absolute difference {worst:.1e} over {len(theory)} toy trees",
            "holds" if worst < THEORY_TOLERANCE else "not shown")


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _comparison_row(r: Result) -> list[str]:
    c, t = r.comparison, r.test
    if t is None:
        return ["", c.label(), c.regime, "", "", "", "", "", "", r.verdict]
    f = ".2f" if c.metric == "calls_multi" else ".1f"
    return ["", c.label(), c.regime, f"{t.effect:+{f}} ± {t.se:{f}}", f"{t.ci_low:+{f}}, {t.ci_high:+{f}}", str(t.n),
            f"{r.mixed} of {t.n}" if r.mixed else "", _p(t.p), _p(r.p_holm), r.verdict]


def claims_table(results: list[Result], rules: Mapping[int, tuple[str, str]]) -> str:
    """The claims table: a row per claim with its verdict, then a row per comparison of that claim; `rules` holds
    the non-statistical claims' (what the rows show, verdict) (`ledger_rule`, `theory_rule`)."""
    from tg.experiments.summary import markdown
    rows = []
    for claim, text in CLAIMS.items():
        parts = [r for r in results if claim in r.comparison.claims]
        if claim in rules:
            shown, decided = rules[claim]
            rows += [[f"**{claim}**", f"**{text}**", "", "", "", "", "", "", "", f"**{decided}**"],
                     ["", shown, "", "", "", "", "", "", "", decided]]
            continue
        held = sum(r.verdict == "holds" for r in parts)
        decided = claim_verdict([r.verdict for r in parts])
        rows.append([f"**{claim}**", f"**{text}**", "", "", "", "", "", "", "",
                     f"**{decided}** ({held} of {len(parts)} hold)"])
        rows += [_comparison_row(r) for r in parts]
    shared = sum(len(c.claims) > 1 for c in {r.comparison for r in results})
    seeds = min((r.test.n for r in results if r.test), default=0)
    bar = (f" With {seeds} seeds, even the family's smallest p holds only if |t| > "
           f"{t_critical(ALPHA / len(results), seeds - 1):.1f} (p < α / {len(results)})." if seeds > 1 else "")
    return (markdown(["#", "claim; comparison (the paper's side)", "start", "effect ± se", "95% CI", "seeds",
                      "pairs on 2 CPU kinds", "p", "Holm p", "verdict"], rows)
            + f"\n\nEffect: cell minus reference at step {FINAL_STEP}, paired by seed, mean ± standard error; p: "
              f"two-sided paired t-test; Holm p: adjusted over the {len(results)} distinct comparisons "
              f"({shared} of them serve two claims and are counted once); verdicts at family-wise "
              f"α = {ALPHA}.{bar}")


def claims_summary(results: list[Result], rules: Mapping[int, tuple[str, str]]) -> str:
    """The README's short table: a row per claim with its verdict and, for a tested claim, its comparison of
    smallest Holm p (the one nearest to holding), effect ± se and p; the full table is `claims_table`."""
    from tg.experiments.summary import markdown
    rows = []
    for claim, text in CLAIMS.items():
        if claim in rules:
            shown, decided = rules[claim]
            rows.append([str(claim), text, shown, decided])
            continue
        parts = [r for r in results if claim in r.comparison.claims]
        tested = [r for r in parts if r.test is not None]
        decided = f"{claim_verdict([r.verdict for r in parts])} ({sum(r.verdict == 'holds' for r in parts)} of " \
                  f"{len(parts)} hold)"
        if not tested:
            rows.append([str(claim), text, "", decided])
            continue
        best = min(tested, key=lambda r: (r.p_holm, r.test.p))
        f = ".2f" if best.comparison.metric == "calls_multi" else ".1f"
        rows.append([str(claim), text, f"{best.comparison.label()}, {best.comparison.regime} start: "
                     f"{best.test.effect:+{f}} ± {best.test.se:{f}}, p {_p(best.test.p)}, Holm p {_p(best.p_holm)}",
                     decided])
    return markdown(["#", "the paper's claim", "nearest to holding: effect ± se (paired by seed)", "verdict"], rows)


def load_frames(root: str | Path | None = None) -> dict[str, pd.DataFrame]:
    """The rows of every grid the claims read that has a CSV (missing grids are left out)."""
    from tg.config import ConfigError
    from tg.experiments.summary import load_rows
    frames = {}
    for name in ("budget", "ledger", "theory", "sweep", "ablation", "shapes", "branching"):
        try:
            frames[name] = load_rows(name, root)
        except ConfigError:
            pass
    return frames


def branching_table(frames: Mapping[str, pd.DataFrame]) -> str:
    """The branching experiment's verdicts: a row per comparison of `BRANCHING`, Holm over those six."""
    from tg.experiments.summary import markdown
    results = evaluate(frames, BRANCHING)
    tested = [r for r in results if r.test is not None]
    decided = [r for r in tested if r.verdict != "not shown"]
    plainly = ""  # in words: which comparisons the rule decided, or that none differs
    if decided:
        plainly = f" {len(decided)} of {len(results)} decided: " + "; ".join(
            f"{r.comparison.label()} ({r.comparison.regime}) {r.verdict}" for r in decided) + "."
    elif tested:
        plainly = (f" None of the {len(tested)} tested comparisons differs beyond what these seeds can tell from "
                   "noise (\"not shown\" is not a shown absence).")
    return (markdown(["", "comparison (the side its method expects)", "start", "effect ± se", "95% CI", "seeds",
                      "pairs on 2 CPU kinds", "p", "Holm p", "verdict"], [_comparison_row(r) for r in results])
            + f"\n\nEffect: cell minus reference at step {FINAL_STEP}, paired by seed, mean ± standard error; p: "
              f"two-sided paired t-test; Holm p: adjusted over these {len(results)} comparisons; verdicts at "
              f"family-wise α = {ALPHA}.{plainly}")


def claims_report(root: str | Path | None = None, short: bool = False) -> str:
    """The claims table of the CSVs under `root` (default: this checkout); `short`: one row per claim."""
    frames = load_frames(root)
    rules = {1: ledger_rule(frames["ledger"]) if "ledger" in frames else ("", "not run"),
             7: theory_rule(frames["theory"]) if "theory" in frames else ("", "not run")}
    return (claims_summary if short else claims_table)(evaluate(frames), rules)
