"""The miniature of claim 1: what a fixed budget buys as chains and as trees.

Reads results/mini/ledger.csv alone (`tg mini run ledger`): one batch of rollouts per (shape, regime,
seed) from the warmed-up policy, counted by the budget ledger. Panels against the chain-equivalent
budget M (1 + L N / 2): trajectories per question, generated tokens per trajectory, searches per
trajectory; chains are circles, trees squares (one marker per Table 3 shape), filled for the moderate
start and hollow for the hard one; mean ± standard error over seeds. The paper's statement for (2,2,1) vs 4 chains
(1.5x the trajectories, docs/paper.md#budget) is drawn as text, labelled. Writes figures/fig_mini_ledger.png.
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
    fig, ax = c.plt.subplots(1, 3, figsize=(14, 4.2))
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
        for _, r in labelled.iterrows():  # shape labels, except where the first panel's points coincide
            a.annotate(c.shape(r["M"], r["N"], r["L"]), (r["budget"], r[f"{value}_mean"]),
                       xytext=(4, 2), textcoords="offset points")
        a.set_xscale("log", base=2)
        a.set_xticks([2, 4, 8, 16], ["2", "4", "8", "16"])  # (6,3,1) and (4,5,1) sit at 15 and 14
        a.minorticks_off()
        a.set_xlabel("chain-equivalent budget M (1 + L N / 2)")
        a.set_title(title)
        a.grid(alpha=0.3)
    ax[0].text(0.02, 0.97, f"{c.PAPER}: (2,2,1) buys 6 trajectories\nfor the cost of 4 chains (1.5x)",
               transform=ax[0].transAxes, va="top", bbox=dict(fc="0.95", ec="0.7"))
    ax[0].legend(loc="lower right")
    fig.suptitle(f"{df['label'].iloc[0]}: what each Table 3 shape buys (one batch of rollouts from the warmed-up "
                 f"policy, mean over {df['seeds'].iloc[0]} seeds)\n{c.ERROR_BARS}")
    fig.tight_layout()
    return fig

