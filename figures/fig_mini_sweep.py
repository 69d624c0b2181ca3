"""Claim 3 of the miniature: chain vs tree trained at budgets ≈2, 4, 8, 16 from each start (Table 3).

Top: the paper's multi-hop rows of Table 3 (results/paper/table3_budget_em.csv, Qwen2.5-3b). Below: the
tg miniature (results/mini/sweep.csv, `tg mini run sweep`: chain G against tree (G/2, 2, 1), multi-hop,
one panel per starting regime, hard first), multi-hop EM at each seed's last step, mean ± standard error over seeds;
a "not run yet" note until the file exists, and at each of the paper's budgets a regime has no rows for.
The dotted line marks the tree at ≈4, for the paper's "a tree at a quarter of the budget matches the
chain" reading.
Writes figures/fig_mini_sweep.png.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from figures import _common as c
from figures.fig_table3_budget import KEYS, _kind, panel
from figures.fig_table3_budget import load as table3

NAME = "fig_mini_sweep.png"


def load(root: Path) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(budget, kind, M, N, L, mean, std, se, count): the paper's multi-hop rows, and ours or None."""
    paper = table3(root)[0].query("hop == 'multi'")
    mini = c.ours(root, "mini/sweep.csv")
    if mini is None:
        return paper, None
    mini = c.trained(mini)
    ours = c.seed_stats(mini.assign(kind=_kind(mini)), KEYS, "em_multi")
    return paper, ours.assign(label=c.tg_label(mini))


def _quarter(ax, df: pd.DataFrame) -> None:
    """A dotted line at the tree's EM at budget ≈4."""
    at4 = df[(df["kind"] == "tree") & (df["budget"] == 4) & (df["N"] == 2)]
    if len(at4):
        ax.axhline(at4["mean"].iloc[0], ls=":", color=c.TREE_COLOR, lw=1, label="tree at ≈4")


def _not_run(ax, df: pd.DataFrame, budgets: list[float]) -> None:
    """Each of the paper's `budgets` without rows in `df` is marked "not run yet"."""
    lo, hi = ax.get_ylim()
    for b in sorted(set(budgets) - set(df["budget"])):
        ax.text(b, hi - 0.04 * (hi - lo), "not run yet", rotation=90, ha="center", va="top", color="0.4")


def draw(root: Path):
    paper, ours = load(root)
    fig, top, below = c.paper_above_starts(ours)
    panel(top, paper)
    _quarter(top, paper)
    top.set_title(f"{c.PAPER}, Qwen2.5-3b: multi-hop avg")
    top.set_ylabel("EM (x100)")
    top.legend(loc="lower right")
    for ax, regime, df in below:
        if df is None:
            c.note(ax, "tg miniature: not run yet\n(`tg mini run sweep`; see results/mini/README.md)")
            continue
        budgets = sorted(paper["budget"].unique())
        panel(ax, df, budgets)
        _not_run(ax, df, budgets)
        _quarter(ax, df)
        ax.set_title(f"{ours['label'].iloc[0]} miniature,{c.start_title(regime)}:\nmulti-hop EM, mean over "
                     f"{c.seed_count(df['count'])} seeds")
        ax.set_ylabel("EM (x100)")
        ax.legend(loc="lower right")
    for ax in fig.axes:
        ax.set_xlabel("budget (chain-equivalent trajectories per prompt)")
    fig.suptitle("Table 3 with training at each budget (top: paper; below: tg, a different model and world)\n"
                 f"shaded: {c.ERROR_BARS.removeprefix('error bars: ')}")
    fig.tight_layout()
    return fig

