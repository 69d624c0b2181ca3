"""Beyond the paper: where to branch, at equal budget (results/mini/README.md, protocol).

Reads results/mini/branching.csv alone (`tg mini run branching`). One column per start (hard, moderate):
top, multi-hop test EM at the final step of chain GRPO (G=4), chain GRPO with GiGPO's step groups,
Tree-GRPO (2,2,1) with random nodes (the paper's rule) and with entropy-guided nodes, mean ± standard
error over seeds, each seed a grey line across the cells (the comparisons pair seeds); bottom, what each
cell spent per training question (generated tokens) and its searches per test question.
Writes figures/fig_mini_branching.png.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from figures import _common as c

NAME = "fig_mini_branching.png"
CELLS = {"chain": ("chain GRPO, G=4", c.CHAIN_COLOR), "chain+steps": ("chain + step groups", "tab:cyan"),
         "tree": ("Tree-GRPO (2,2,1), random", c.TREE_COLOR), "tree-entropy": ("Tree-GRPO (2,2,1), entropy", "tab:red")}


def load(root: Path) -> pd.DataFrame | None:
    """The training rows at each (cell, seed)'s last evaluation, with the short cell name in `method`."""
    df = c.ours(root, "mini/branching.csv")
    if df is None:
        return None
    df = c.final_rows(c.trained(df), ["cell", "seed"])
    return df.assign(method=df["cell"].str.rpartition("/")[2])


def draw(root: Path):
    df = load(root)
    starts = c.by_start(df) if df is not None else []
    fig, ax = c.plt.subplots(2, max(len(starts), 1), figsize=(6.5 * max(len(starts), 1), 7.5), squeeze=False)
    if df is None:
        for a in ax.ravel():
            c.note(a, "tg miniature: not run yet\n(`tg mini run branching`, see results/mini/README.md)")
        return fig
    x = np.arange(len(CELLS))
    for k, (regime, d) in enumerate(starts):
        top, bottom = ax[0, k], ax[1, k]
        wide = d.pivot_table(index="seed", columns="method", values="em_multi").reindex(columns=list(CELLS))
        for _, seed in wide.iterrows():
            top.plot(x, seed.to_numpy(), color="grey", alpha=0.4, lw=0.8, marker=".")
        mean, se = wide.mean(), wide.std() / np.sqrt(wide.count())
        bars = top.bar(x, mean.fillna(0), 0.6, yerr=se.fillna(0), capsize=3, alpha=0.8,
                       color=[color for _, color in CELLS.values()])
        c.bar_labels(top, bars, fmt="{:.1f}", inside=True)
        top.set_xticks(x, [label.replace(", ", "\n") for label, _ in CELLS.values()])
        top.set_ylabel(f"multi-hop test EM (x100) at step {int(d['step'].max())}")
        top.set_title(f"{c.tg_label(d)}, {regime} start: mean, lines = seeds")
        top.grid(axis="y", alpha=0.3)
        spent = d.groupby("method")[["generated_per_q", "calls_multi"]].mean().reindex(list(CELLS))
        bottom.bar(x - 0.2, spent["generated_per_q"].fillna(0), 0.4, color="tab:grey", label="generated tokens / training q")
        twin = bottom.twinx()
        twin.bar(x + 0.2, spent["calls_multi"].fillna(0), 0.4, color="tab:green", label="searches / multi-hop test q")
        bottom.set_xticks(x, [label.replace(", ", "\n") for label, _ in CELLS.values()])
        bottom.set_ylabel("generated tokens per training question")
        twin.set_ylabel("searches per multi-hop test question")
        bottom.set_title("the budget each cell spent (mean over training) and its searches at the end")
        bottom.set_ylim(0, 1.3 * spent["generated_per_q"].max())   # headroom: the legends sit above the bars
        twin.set_ylim(0, 1.3 * spent["calls_multi"].max())
        bottom.legend(loc="upper left")
        twin.legend(loc="upper right")
    fig.suptitle("Where to branch at equal budget (≈4 chain-equivalents): beyond the paper, tg's miniature only\n"
                 + c.ERROR_BARS)
    fig.tight_layout()
    return fig
