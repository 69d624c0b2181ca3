"""What the committed miniature rows say about tree against chain, as tables and the sentences that state them
(notebook 05 prints them; no lesson types a result by hand).

- `exploratory_vs_fresh`: multi-hop EM at step 60 per start, the `budget` grid's exploratory seeds beside the
  confirmatory experiment's fresh seeds, each method's mean and tree − chain; `winners_curse` says which method
  moved between the two;
- `signal_shares`: from the per-step rows, the share of a step's prompts whose leaves' rewards differ (the only
  prompts with any advantage, Eq. 5-7) and the extra such prompts a tree buys per step, early and late;
- `agreement`: how often the tree- and the chain-trained agent of one seed score the same on a test question;
- `paper_gain_here`: the paper's relative gain at a budget (Table 3) applied to the chain's EM here, beside the
  exploratory `sweep` grid's 95% interval for the same comparison.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tg.experiments import confirm
from tg.experiments.confirm_report import load
from tg.experiments.grid_files import mini_dir, outcome_vector
from tg.experiments.summary import load_rows, load_steps
from tg.experiments.verdict import t_critical

STARTS = ("hard", "moderate")


def _em_at(rows: pd.DataFrame, step: int) -> pd.DataFrame:
    """Multi-hop EM per (regime, seed) of chain and tree at `step`, seeds that have both."""
    at = rows[(rows["setting"] == "multi-hop") & (rows["step"] == step) & rows["method"].isin(["chain", "tree"])]
    return at.pivot_table(index=["regime", "seed"], columns="method", values="em_multi").dropna()


def exploratory_vs_fresh(root: str | Path | None = None, step: int = confirm.STEP) -> pd.DataFrame:
    """One row per (start, seeds): 'exploratory' (the budget grid) and 'fresh' (the confirmatory experiment), with
    the seed range, n, chain EM, tree EM and tree − chain (means over seeds, multi-hop EM at `step`)."""
    out = []
    for name, rows in (("exploratory", load_rows("budget", root)), ("fresh", load(root))):
        wide = _em_at(rows, step)
        for start in STARTS:
            w = wide.loc[start]
            out.append({"start": start, "seeds": name, "seed range": f"{w.index.min()}-{w.index.max()}",
                        "n": len(w), "chain": w["chain"].mean(), "tree": w["tree"].mean(),
                        "tree − chain": (w["tree"] - w["chain"]).mean()})
    return pd.DataFrame(out)


def winners_curse(table: pd.DataFrame) -> str:
    """Per start: the edge on the exploratory seeds and on the fresh ones, and how far each method's EM moved."""
    lines = []
    for start in STARTS:
        e, f = (table[(table["start"] == start) & (table["seeds"] == s)].iloc[0] for s in ("exploratory", "fresh"))
        moved = {m: f[m] - e[m] for m in ("chain", "tree")}
        most = max(moved, key=lambda m: abs(moved[m]))
        lines.append(f"{start} start: tree − chain {e['tree − chain']:+.1f} EM points on seeds {e['seed range']}, "
                     f"{f['tree − chain']:+.1f} on the {f['n']} fresh seeds; the {most} moved most: "
                     f"{e[most]:.1f} on seeds {e['seed range']} against {f[most]:.1f} on the fresh seeds "
                     f"(the other, {'tree' if most == 'chain' else 'chain'}, "
                     f"{moved['tree' if most == 'chain' else 'chain']:+.1f})")
    return "\n".join(lines)


def signal_shares(root: str | Path | None = None, prompts: int = 16, early: int = 30,
                  last: int = confirm.STEP) -> pd.DataFrame:
    """Per start, from the confirmatory experiment's step rows (fresh seeds, steps 1..`last`): each method's share
    of prompts whose leaves' rewards differ (1 − zero_std_inter), in steps 1..`early` and after, and the tree's
    extra prompts with signal per step (tree − chain, paired by seed and step, times `prompts` per step)."""
    s = load_steps(root)[confirm.GRID]
    s = s[s["step"] <= last].join(s["cell"].str.split("/", expand=True).set_axis(["setting", "start", "method"],
                                                                                 axis=1))
    s = s[(s["setting"] == "multi-hop") & s["method"].isin(["chain", "tree"])].assign(
        signal=1 - s["zero_std_inter"], window=np.where(s["step"] <= early, f"steps 1-{early}",
                                                        f"steps {early + 1}-{last}"))
    wide = s.pivot_table(index=["start", "window", "seed", "step"], columns="method", values="signal")
    per = wide.groupby(level=["start", "window"]).mean()
    per["extra prompts per step"] = (wide["tree"] - wide["chain"]).groupby(level=["start", "window"]).mean() * prompts
    per.columns.name = None
    return per.rename(columns={"chain": "chain: share with signal", "tree": "tree: share with signal"}).reset_index()


def agreement(root: str | Path | None = None, step: int = confirm.STEP) -> pd.DataFrame:
    """Per start: over the fresh seeds, the share of the multi-hop test questions on which the tree- and the
    chain-trained agent of one seed score the same (both right or both wrong) at `step`: mean, min, max."""
    q = confirm.load_questions(root)
    at = q[q["step"] == step].set_index(["cell", "seed"])
    out = []
    for start in STARTS:
        seeds = sorted({s for c, s in at.index if c == f"multi-hop/{start}/tree"}
                       & {s for c, s in at.index if c == f"multi-hop/{start}/chain"})
        same = [float(np.mean(outcome_vector(at.loc[(f"multi-hop/{start}/tree", s)], "multi")
                              == outcome_vector(at.loc[(f"multi-hop/{start}/chain", s)], "multi"))) for s in seeds]
        out.append({"start": start, "seeds": len(same), "same outcome": np.mean(same), "min": min(same),
                    "max": max(same)})
    return pd.DataFrame(out)


def paper_gain_here(root: str | Path | None = None, budget: int = 2, step: int = confirm.STEP) -> pd.DataFrame:
    """Per start: Table 3's relative multi-hop gain of the tree over the chain at `budget`, the EM points it would
    add to the `sweep` grid's chain at that budget (step `step`), and that grid's tree − chain with its 95% t
    interval (paired by seed)."""
    t3 = pd.read_csv(mini_dir(root).parent / "paper" / "table3_budget_em.csv")
    at = t3[t3["budget"] == budget].set_index("method")["multi_hop_avg"]
    gain = at["Tree"] / at["Chain"] - 1
    sweep = load_rows("sweep", root)
    sweep = sweep[(sweep["step"] == step) & (sweep["budget"].round() == budget)]
    out = []
    for start in STARTS:
        s = sweep[sweep["regime"] == start].assign(kind=sweep["method"].str.split(r"[- ]", regex=True).str[0])
        s = s.pivot_table(index="seed", columns="kind", values="em_multi").dropna()
        d = s["tree"] - s["chain"]
        half = t_critical(0.05, len(d) - 1) * d.std() / np.sqrt(len(d))
        out.append({"start": start, "paper gain": gain, "chain EM here": s["chain"].mean(),
                    "paper gain here (EM points)": gain * s["chain"].mean(), "seeds": len(d),
                    "measured tree − chain": d.mean(), "95% CI low": d.mean() - half, "95% CI high": d.mean() + half})
    return pd.DataFrame(out)
