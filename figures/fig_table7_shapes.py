"""Table 7 of arXiv 2509.21240: tree shapes (M, N, L) at fixed budgets of about 4 and 16.

Top: the paper (results/paper/table7_tree_structure_em.csv, Qwen2.5-3b, multi-hop avg EM; its first
block is printed "budget about 2", recorded as 4, see results/paper/README.md). Bottom: the tg
miniature (results/mini/shapes.csv: budget, M, N, L, regime, seed, em_multi, ...), mean ± standard error over seeds, each
shape in the block of the power of 2 nearest its budget, as the paper groups them, one block per starting
regime (hard first).
Each bar is labelled with its shape, its leaves per prompt, M (1 + L N), and its expected cost in
chains, M (1 + L N / 2) (`tg.budget.chain_equivalent_budget`).
Writes figures/fig_table7_shapes.png.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from figures import _common as c

NAME = "fig_table7_shapes.png"
KEYS = ["budget", "M", "N", "L"]


def load(root: Path) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(budget, M, N, L, mean, std, se, count): the paper's, and ours or None."""
    p = c.paper(root, "table7_tree_structure_em")
    paper = p.rename(columns={"budget_block": "budget"}).assign(mean=p["multi_hop_avg"], std=0.0, se=0.0, count=1)
    mini = c.ours(root, "mini/shapes.csv")
    if mini is None:
        return paper[KEYS + ["mean", "std", "se", "count"]], None
    # each shape in the paper's block of its budget, the nearest power of 2 ((1,5,1) costs 3.5: block 4)
    mini = c.trained(mini).assign(N=mini["N"].fillna(0), L=mini["L"].fillna(0),
                                  budget=2 ** np.round(np.log2(mini["budget"])))
    ours = c.seed_stats(mini, KEYS, "em_multi")
    ours = ours.assign(tree=ours["N"] > 0).sort_values(["budget", "tree", "M", "N"], ascending=[True, True, False, False])
    return paper[KEYS + ["mean", "std", "se", "count"]], ours.assign(label=c.tg_label(mini))


def panel(ax, df: pd.DataFrame) -> None:
    """One bar per shape; the chain (N = 0) in the chain colour."""
    x = np.arange(len(df))
    chain = df["N"].fillna(0).eq(0).to_numpy()
    several = bool((df["count"] > 1).any())
    bars = ax.bar(x, df["mean"], 0.7, yerr=df["se"] if several else None, capsize=3,
                  color=np.where(chain, c.CHAIN_COLOR, c.TREE_COLOR))
    c.bar_labels(ax, bars, inside=several)
    m, ln = df["M"], df["L"].fillna(0) * df["N"].fillna(0)
    ticks = [f"{c.shape(*s)}\n{k:g} leaves\ncost {e:g}" for *s, k, e in
             zip(df["M"], df["N"], df["L"], m * (1 + ln), m * (1 + ln / 2))]
    ax.set_xticks(x, ticks)
    ax.grid(axis="y", alpha=0.3)


def _row(subfig, df: pd.DataFrame, title) -> list:
    """One panel per block: (start, budget) in the rows' order for ours, budget for the paper's."""
    df = df.assign(regime=df["regime"] if "regime" in df else "").sort_values("budget", kind="stable")
    df = pd.concat([d for _, d in c.by_start(df)])
    blocks = list(dict.fromkeys(zip(df["regime"], df["budget"])))
    in_block = [(df["regime"] == r) & (df["budget"] == b) for r, b in blocks]
    axes = subfig.subplots(1, len(blocks), sharey=True, width_ratios=[int(m.sum()) for m in in_block], squeeze=False)[0]
    for ax, (r, b), m in zip(axes, blocks, in_block):
        panel(ax, df[m])
        ax.set_title(title(r, b))
    axes[0].set_ylabel("multi-hop EM (x100)")
    return axes


def draw(root: Path):
    paper, ours = load(root)
    fig = c.plt.figure(figsize=(12, 7.5 if ours is not None else 5), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1, 1 if ours is not None else 0.3])
    top.suptitle(f"{c.PAPER}, Qwen2.5-3b: multi-hop avg EM")
    axes = _row(top, paper, lambda _, b: f"budget ≈{b:g}" + (" (printed ≈2; see results/paper/README.md)" if b == 4 else ""))
    axes[0].set_ylim(0, paper["mean"].max() * 1.12)
    if ours is None:
        c.note(bottom.subplots(), "tg miniature: not run yet (see results/mini/README.md)")
    else:
        bottom.suptitle(f"{ours['label'].iloc[0]} miniature: multi-hop EM, mean over seeds; " + c.ERROR_BARS)
        _row(bottom, ours, lambda r, b: f"budget ≈{b:g},{c.start_title(r)}")
    fig.suptitle("Table 7: tree shape (M trees, N nodes expanded per iteration, L iterations) at a fixed budget; "
                 "blue = chains;\nleaves = M (1 + L N) trajectories per prompt; cost = M (1 + L N / 2) chain-equivalents")
    return fig

