"""The miniature of claim 1: what a fixed budget buys as chains and as trees.

Reads results/mini/ledger.csv alone (`tg mini run ledger`): one batch of rollouts per (shape, regime,
seed) from the warmed-up policy, counted by the budget ledger. Panels against the chain-equivalent
budget M (1 + L N / 2): trajectories per question, generated tokens per trajectory, searches per
trajectory; chains are circles, trees squares (one marker per Table 3 shape), filled for the moderate
start and hollow for the hard one; mean ± standard error over seeds. The fourth panel holds the legend and the paper's
statement for (2,2,1) vs 4 chains (1.5x the trajectories, docs/paper.md#budget), as text, labelled.
Writes figures/fig_mini_ledger.png.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from figures import _common as c

NAME = "fig_mini_ledger.png"
VALUES = [("trajectories_per_q", "trajectories per question"), ("generated_per_traj", "generated tokens per trajectory"),
          ("calls_per_traj", "searches per trajectory")]


def load(root: Path) -> pd.DataFrame | None:
    """Mean and standard error (`sem`) over seeds per (regime, M, N, L), with the budget and kind."""
    df = c.ours(root, "mini/ledger.csv")
    if df is None:
        return None
    keys = ["regime", "M", "N", "L", "budget", "method"]
    out = df.groupby(keys)[[v for v, _ in VALUES]].agg(["mean", "sem"])
    out.columns = [f"{v}_{s}" for v, s in out.columns]
    return out.reset_index().assign(label=c.tg_label(df), seeds=df.groupby(keys)["seed"].nunique().max())


def draw(root: Path):
    df = load(root)
    fig, grid = c.plt.subplots(2, 2, figsize=(12, 8))   # two rows: readable at a notebook's width
    ax, key = [grid[0, 0], grid[0, 1], grid[1, 0]], grid[1, 1]
    key.axis("off")
    if df is None:
        for a in ax:
            c.note(a, "tg miniature: not run yet\n(`tg mini run ledger`)")
        return fig
    for a, (value, title) in zip(ax, VALUES):
        for (regime, method), d in df.groupby(["regime", "method"]):
            color = c.CHAIN_COLOR if method == "chain" else c.TREE_COLOR
            face = color if regime == "moderate" else "none"
            a.errorbar(d["budget"], d[f"{value}_mean"], yerr=d[f"{value}_sem"].fillna(0), ls="none", capsize=2,
                       marker="o" if method == "chain" else "s", mfc=face, color=color, ms=6,
                       label=f"{method}, {regime} start")
        labelled = df[(df["method"] == "tree") & (df["regime"] == "moderate")] if a is not ax[0] else df.iloc[:0]
        budgets = set(labelled["budget"])
        for _, r in labelled.iterrows():  # shape labels, except where the first panel's points coincide
            crowded = any(r["budget"] < b <= 1.2 * r["budget"] for b in budgets)   # a shape just right of it: go left
            a.annotate(c.shape(r["M"], r["N"], r["L"]), (r["budget"], r[f"{value}_mean"]), textcoords="offset points",
                       xytext=(-5 if crowded else 4, 2), ha="right" if crowded else "left")
        a.set_xscale("log", base=2)
        a.set_xticks([2, 4, 8, 16], ["2", "4", "8", "16"])  # (6,3,1) and (4,5,1) sit at 15 and 14
        a.set_xlim(1.7, 24)   # room for the shape labels right of the points at 16
        a.minorticks_off()
        a.set_xlabel("chain-equivalent budget M (1 + L N / 2)")
        a.set_title(title)
        a.grid(alpha=0.3)
    c.legend(key, ax[0], loc="upper left", title="markers (mean over seeds)")
    key.text(0.0, 0.35, f"{c.PAPER}:\n(2,2,1) buys 6 trajectories\nfor the cost of 4 chains (1.5x)", va="top",
             transform=key.transAxes, bbox=dict(fc="0.95", ec="0.7"))
    fig.suptitle(f"{df['label'].iloc[0]}: what each Table 3 shape buys (one batch of rollouts from the warmed-up "
                 f"policy,\nmean over {df['seeds'].iloc[0]} seeds); {c.ERROR_BARS}")
    fig.tight_layout()
    return fig
