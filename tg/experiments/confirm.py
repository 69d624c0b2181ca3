"""The confirmatory experiment: at equal budget, does Tree-GRPO train a better agent than chain GRPO?

The exploratory grids (results/mini/README.md) measured tree (2,2,1) − chain (G = 4) at +3.1 (hard start) and +1.5
(moderate start) multi-hop EM points over 5 seeds each, too few seeds under a family of 28 comparisons to tell.
This module is the machine-readable twin of results/mini/confirm.md: fresh seeds, one primary comparison, a
two-look rule, its secondaries and what "holds", "refuted" and "inconclusive" mean, all fixed before the grid's
first row. `tg mini run confirm` runs the cells the rule asks for next (`active_cells`); `primary_verdict` and
`secondary_results` apply the rule to the rows; scipy and statsmodels do the arithmetic (tg.experiments.verdict).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
import numpy as np
import pandas as pd

from tg.experiments.cells import CHAIN4, TREE221, Cell, train_cells, tree_shape
from tg.experiments.grid_files import grid_rows, mini_dir, outcome_vector
from tg.experiments.verdict import ALPHA, OneSidedTest, holm, one_sided_test, paired_test, two_look_levels

GRID = "confirm"
STAGE1_SEEDS: tuple[int, ...] = tuple(range(100, 112))
"""Look 1's seeds. Every committed row of the other grids has optim.seed 0-4 (training) or 0-19 (toy trees)."""
STAGE2_SEEDS: tuple[int, ...] = tuple(range(112, 124))
"""Added only if look 1 neither holds nor refutes: look 2 reads all 24 seeds (the maximum)."""
STEP = 60
"""The primary's evaluation step (the cpu preset's optim.steps)."""
HORIZON = (30, 60, 90, 120)
"""Stage 1's primary runs train on to step 120 (exploratory): the constant learning rate of the cpu preset makes
their first 60 steps those of a 60-step run, so the step-60 rows serve the primary unchanged."""
STARTS = ("hard", "moderate")
PAPER_TREE_EM, PAPER_CHAIN_EM = 36.8, 31.8
"""The paper's Table 3 (Qwen2.5-3B), budget 4, multi-hop average EM: tree (2,2,1) and chain."""
CHAIN_EM_HERE = (17.534 + 21.402) / 2
"""Chain (G = 4) multi-hop EM at step 60 here, the budget grid's 5 seeds, averaged over the hard and moderate starts."""
DELTA = (PAPER_TREE_EM / PAPER_CHAIN_EM - 1) * CHAIN_EM_HERE
"""The paper's effect on this scale: its relative gain at budget 4 (+15.7%) times the chain's EM here, 3.06 points."""
LEVELS = two_look_levels(len(STAGE1_SEEDS), len(STAGE1_SEEDS) + len(STAGE2_SEEDS), ALPHA)
"""Nominal one-sided levels of look 1 and look 2 (O'Brien-Fleming-type spending of one-sided alpha 0.05)."""


@dataclass(frozen=True)
class Pair:
    """Tree minus chain, one cell each, in one setting and start."""

    name: str
    setting: str
    starts: tuple[str, ...]
    tree: str
    chain: str
    metric: str = "em_multi"


PRIMARY = Pair("tree (2,2,1) − chain (G = 4), multi-hop EM at step 60", "multi-hop", STARTS, "tree", "chain")
"""Per seed, the mean over the two starts of tree − chain; one-sided t-test of mean > 0."""
SINGLE = Pair("single-hop: tree (2,2,1) − chain (G = 4), single-hop EM", "single-hop", ("moderate",), "tree", "chain",
              "em_single")
SECONDARY: tuple[Pair, ...] = (
    Pair("hard start alone", "multi-hop", ("hard",), "tree", "chain"),
    Pair("moderate start alone", "multi-hop", ("moderate",), "tree", "chain"),
    Pair("budget 2: tree (1,2,1) − chain (G = 2)", "multi-hop", STARTS, "tree (1,2,1)", "chain-2"),
    Pair("budget 8: tree (4,2,1) − chain (G = 8)", "multi-hop", STARTS, "tree (4,2,1)", "chain-8"),
    SINGLE,
)
MORE_ON_MULTI = "more on multi-hop than on single-hop (moderate start)"
"""The sixth secondary: per seed, (moderate multi-hop tree − chain) − (single-hop tree − chain) > 0."""


def cells() -> list[Cell]:
    """Every cell the protocol may run, each labelled with its `stage`: '1' (look 1's seeds, trained to 120
    steps), '2' (look 2's added seeds, 60 steps) and 'secondary' (run only once the primary holds)."""
    def staged(cs: list[Cell], stage: str, points: tuple[int, ...] = (30, 60)) -> list[Cell]:
        return [Cell(c.name, c.kind, c.overrides, c.seeds, points if c.kind == "train" else c.points,
                     {**c.labels, "stage": stage}) for c in cs]
    pair = {"chain": CHAIN4, "tree": TREE221}
    out: list[Cell] = []
    for start in STARTS:
        out += staged(train_cells(start, "multi-hop", pair, seeds=STAGE1_SEEDS), "1", HORIZON)
    for start in STARTS:
        out += staged(train_cells(start, "multi-hop", pair, seeds=STAGE2_SEEDS, start=False), "2")
    budgets = {"chain-2": tree_shape(2, 0, 0), "tree (1,2,1)": tree_shape(1, 2, 1),
               "chain-8": tree_shape(8, 0, 0), "tree (4,2,1)": tree_shape(4, 2, 1)}
    for start in STARTS:
        out += staged(train_cells(start, "multi-hop", budgets, seeds=STAGE1_SEEDS, start=False), "secondary")
    out += staged(train_cells("moderate", "single-hop", pair, seeds=STAGE1_SEEDS), "secondary")
    return out


def pair_differences(rows: pd.DataFrame, pair: Pair, step: int = STEP) -> pd.Series:
    """Tree − chain at `step`, averaged over the pair's starts, one value per seed that has all of them."""
    at = rows[rows["step"] == step]
    parts = []
    for start in pair.starts:
        def metric(cell: str) -> pd.Series:
            return at[at["cell"] == f"{pair.setting}/{start}/{cell}"].set_index("seed")[pair.metric].astype(float)
        parts.append(metric(pair.tree) - metric(pair.chain))
    return pd.concat(parts, axis=1).dropna().mean(axis=1).sort_index()


@dataclass(frozen=True)
class Look:
    """The primary test at one look and what the rule decides there."""

    look: int
    level: float
    test: OneSidedTest
    decision: str
    """'holds', 'refuted', 'continue' (look 1 only: add stage 2's seeds) or 'inconclusive' (look 2 only)"""


def decide(test: OneSidedTest, level: float, last: bool) -> str:
    """The declared rule at one look: holds if p < level; else refuted if the (1 - level) upper bound is below
    DELTA; else continue (look 1) or inconclusive (look 2)."""
    if test.p < level:
        return "holds"
    if test.upper < DELTA:
        return "refuted"
    return "inconclusive" if last else "continue"


def primary_looks(rows: pd.DataFrame) -> list[Look]:
    """The looks the rows allow, in order: none before every stage-1 seed has its four step-60 rows; look 2 only
    after look 1 said continue and every stage-2 seed is in."""
    d = pair_differences(rows, PRIMARY)
    first = d[d.index.isin(STAGE1_SEEDS)]
    if len(first) < len(STAGE1_SEEDS):
        return []
    t1 = one_sided_test(first.to_numpy(), LEVELS[0])
    looks = [Look(1, LEVELS[0], t1, decide(t1, LEVELS[0], last=False))]
    both = d[d.index.isin(STAGE1_SEEDS + STAGE2_SEEDS)]
    if looks[0].decision == "continue" and len(both) == len(STAGE1_SEEDS) + len(STAGE2_SEEDS):
        t2 = one_sided_test(both.to_numpy(), LEVELS[1])
        looks.append(Look(2, LEVELS[1], t2, decide(t2, LEVELS[1], last=True)))
    return looks


def primary_verdict(rows: pd.DataFrame) -> str:
    """'holds', 'refuted', 'inconclusive', or where the experiment stands ('stage 1 running', 'stage 2 running')."""
    looks = primary_looks(rows)
    if not looks:
        return "stage 1 running"
    return "stage 2 running" if looks[-1].decision == "continue" else looks[-1].decision


def active_cells(all_cells: list[Cell], rows: pd.DataFrame | None) -> list[Cell]:
    """The cells the rule runs now: stage 1 always; stage 2 once look 1 says continue; the secondaries once the
    primary holds."""
    looks = primary_looks(rows) if rows is not None else []
    stages = {"1"} | ({"2"} if looks and looks[0].decision == "continue" else set())
    stages |= {"secondary"} if looks and looks[-1].decision == "holds" else set()
    return [c for c in all_cells if c.labels.get("stage") in stages]


@dataclass(frozen=True)
class Secondary:
    name: str
    seeds: int
    test: OneSidedTest | None
    p_holm: float
    verdict: str
    """'holds' (Holm p < alpha), 'not shown', or 'not tested' (the primary did not hold, or no rows yet)"""


def secondary_results(rows: pd.DataFrame) -> list[Secondary]:
    """The six secondaries, tested only if the primary holds: one-sided paired t-tests (> 0), Holm over the six.
    The starts alone read the seeds of the look that decided; the others read stage 1's seeds."""
    looks = primary_looks(rows)
    names = [p.name for p in SECONDARY] + [MORE_ON_MULTI]
    if not looks or looks[-1].decision != "holds":
        return [Secondary(n, 0, None, 1.0, "not tested") for n in names]
    decided = STAGE1_SEEDS if looks[-1].look == 1 else STAGE1_SEEDS + STAGE2_SEEDS
    multi = pair_differences(rows, Pair("", "multi-hop", ("moderate",), "tree", "chain"))
    diffs = [pair_differences(rows, p) for p in SECONDARY] + [(multi - pair_differences(rows, SINGLE)).dropna()]
    wanted = [decided if p.starts != STARTS and p.setting == "multi-hop" else STAGE1_SEEDS for p in SECONDARY]
    wanted.append(STAGE1_SEEDS)
    tests = [one_sided_test(d[d.index.isin(w)].to_numpy(), ALPHA) if d.index.isin(w).sum() == len(w) else None
             for d, w in zip(diffs, wanted)]
    adjusted = holm([t.p if t else 1.0 for t in tests])
    return [Secondary(n, t.n if t else 0, t, p, ("holds" if p < ALPHA else "not shown") if t else "not tested")
            for n, t, p in zip(names, tests, adjusted)]


def horizon(rows: pd.DataFrame) -> pd.DataFrame:
    """Exploratory: tree − chain multi-hop EM per start at each of `HORIZON`'s steps on stage 1's seeds, mean and
    two-sided 95% t interval, with the chain's and the tree's means."""
    out = []
    s1 = rows[rows["seed"].isin(STAGE1_SEEDS)]
    for start in STARTS:
        for step in HORIZON:
            d = pair_differences(s1, Pair("", "multi-hop", (start,), "tree", "chain"), step)
            if len(d) < 2:
                continue
            t = paired_test(d.tolist())
            at = s1[(s1["step"] == step) & s1["cell"].str.startswith(f"multi-hop/{start}/")]
            means = at.groupby("method")["em_multi"].mean()
            out.append({"start": start, "step": step, "seeds": t.n, "chain": means.get("chain"),
                        "tree": means.get("tree"), "effect": t.effect, "ci_low": t.ci_low, "ci_high": t.ci_high})
    return pd.DataFrame(out)


def mixed_machines(rows: pd.DataFrame) -> list[str]:
    """The (pair, start, seed) whose tree and chain rows were not all made on one CPU kind, or whose run resumed on
    another kind ('A → B' in `machine`); the declared test keeps them, the report names them."""
    flagged = []
    for pair in (PRIMARY, *SECONDARY):
        for start in pair.starts:
            cells = [f"{pair.setting}/{start}/{c}" for c in (pair.tree, pair.chain)]
            for seed, g in rows[rows["cell"].isin(cells)].groupby("seed"):
                kinds = set(g["machine"].astype(str))
                if len(kinds) > 1 or any("→" in k for k in kinds):
                    flagged.append(f"{pair.setting}/{start} {pair.tree} − {pair.chain}, seed {seed}: "
                                   + " | ".join(sorted(kinds)))
    return sorted(set(flagged))


def bootstrap_interval(questions: pd.DataFrame, seeds: list[int], resamples: int = 10_000,
                       seed: int = 0) -> tuple[float, float]:
    """A robustness check beside the declared test (not the verdict): the 95% percentile interval of the
    primary's mean difference when both seeds and test questions are resampled with replacement (two levels:
    scipy.stats.bootstrap resamples one). `questions`: the grid's question-level file."""
    at = questions[questions["step"] == STEP].set_index(["cell", "seed"])
    per_seed = []
    for s in seeds:
        parts = [outcome_vector(at.loc[(f"multi-hop/{start}/tree", s)], "multi")
                 - outcome_vector(at.loc[(f"multi-hop/{start}/chain", s)], "multi") for start in PRIMARY.starts]
        per_seed.append(100 * np.mean(parts, axis=0))  # per question: tree − chain, averaged over the starts
    q = np.asarray(per_seed)
    rng = np.random.default_rng(seed)
    means = []
    for chunk in np.array_split(np.arange(resamples), max(1, resamples // 500)):
        pick_seed = rng.integers(len(q), size=(len(chunk), len(q)))
        pick_q = rng.integers(q.shape[1], size=(len(chunk), len(q), q.shape[1]))
        means.append(q[pick_seed[..., None], pick_q].mean(axis=(1, 2)))
    low, high = np.percentile(np.concatenate(means), [2.5, 97.5])
    return float(low), float(high)


def load_questions(root: str | Path | None = None) -> pd.DataFrame | None:
    """results/mini/questions/confirm.csv, or None before its first row."""
    path = mini_dir(root) / "questions" / f"{GRID}.csv"
    if not path.exists():
        return None
    rows = pd.DataFrame(grid_rows(path))  # strings as written: `correct` and `searches` keep their leading zeros
    return rows.astype({"seed": int, "step": int, "n_single": int})
