"""The confirmatory experiment (results/mini/confirm.md): does Tree-GRPO (2,2,1) beat chain GRPO (G = 4) at equal
budget on fresh seeds?

Reads results/mini/confirm.csv alone (`tg mini run confirm`). Top: each seed's paired difference d (tree − chain
multi-hop EM at step 60, averaged over the hard and moderate starts), their mean with its 95% t interval, zero, and
the paper's effect translated to this scale (Table 3's relative gain at budget 4 times the chain's EM here).
Bottom: the horizon check on stage 1's seeds, per start: tree and chain multi-hop EM at steps 0 (the pinned start),
30, 60, 90 and 120, mean with 95% t intervals over seeds. Error bars are 95% t intervals everywhere.
Writes figures/fig_mini_confirm.png.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from figures import _common as c
from tg.experiments import confirm

NAME = "fig_mini_confirm.png"
FONT = 11


def _ci(v: pd.Series) -> float:
    """Half-width of the 95% t interval of the mean (0 for one value)."""
    return float(stats.t.ppf(0.975, len(v) - 1) * stats.sem(v)) if len(v) > 1 else 0.0


def differences(ax, rows: pd.DataFrame) -> None:
    d = confirm.pair_differences(rows, confirm.PRIMARY)
    if d.empty:
        c.note(ax, "no seed has all four step-60 rows yet\n(`tg mini run confirm`)")
        return
    stage2 = d.index.isin(confirm.STAGE2_SEEDS)
    x = np.arange(len(d))
    ax.scatter(x[~stage2], d[~stage2], color="k", s=22, zorder=3, label="a seed, stage 1")
    if stage2.any():
        ax.scatter(x[stage2], d[stage2], color="0.5", s=22, zorder=3, label="a seed, stage 2")
    ax.errorbar([len(d) + 0.8], [d.mean()], yerr=[_ci(d)], color=c.TREE_COLOR, marker="D", capsize=5, lw=2,
                label=f"mean, 95% CI ({len(d)} seeds)")
    ax.axhline(0, color="0.3", lw=1)
    ax.axhline(confirm.DELTA, color="tab:red", ls="--", lw=1.5,
               label=f"{c.PAPER}: Table 3's +{confirm.PAPER_TREE_EM / confirm.PAPER_CHAIN_EM - 1:.1%} at budget 4\n"
                     f"on this scale: {confirm.DELTA:+.2f}")
    ax.set_xticks(list(x) + [len(d) + 0.8], [str(s) for s in d.index] + ["mean"], fontsize=FONT - 1, rotation=90)
    ax.set_xlabel("seed", fontsize=FONT)
    ax.set_ylabel("tree − chain, multi-hop EM points (step 60)", fontsize=FONT)
    low, high = min(0.0, d.min(), d.mean() - _ci(d)), max(confirm.DELTA, d.max(), d.mean() + _ci(d))
    ax.set_ylim(low - 0.05 * (high - low), high + 0.8 * (high - low))  # a top band for the legend
    ax.legend(fontsize=FONT - 1, loc="upper left")
    ax.grid(alpha=0.3)


def horizon(ax, rows: pd.DataFrame, start: str) -> None:
    s1 = rows[rows["seed"].isin(confirm.STAGE1_SEEDS) & rows["cell"].str.startswith(f"multi-hop/{start}/")]
    begin = rows[rows["cell"] == f"multi-hop/{start}/start"]["em_multi"]
    if s1.empty:
        c.note(ax, f"{start} start: no stage-1 row yet")
        return
    for method, color in (("chain", c.CHAIN_COLOR), ("tree", c.TREE_COLOR)):
        g = s1[s1["method"] == method].groupby("step")["em_multi"]
        m = g.mean()
        steps = [0, *m.index] if len(begin) else list(m.index)
        means = [float(begin.iloc[0]), *m] if len(begin) else list(m)
        errs = [0.0, *g.apply(_ci)] if len(begin) else list(g.apply(_ci))
        ax.errorbar(steps, means, yerr=errs, color=color, marker="o", capsize=3, lw=2,
                    label=f"{'chain GRPO, G = 4' if method == 'chain' else 'Tree-GRPO (2,2,1)'} "
                          f"({c.seed_count(g.count())} seeds)")
    ax.axvline(confirm.STEP, color="0.5", ls=":", lw=1)
    ax.set_title(f"horizon, {start} start (exploratory)", fontsize=FONT + 1)
    ax.set_xlabel("training step", fontsize=FONT)
    ax.set_ylabel("greedy multi-hop test EM (x100)", fontsize=FONT)
    ax.set_ylim(0, None)
    ax.legend(fontsize=FONT - 1, loc="lower right")
    ax.grid(alpha=0.3)


def draw(root: Path):
    from tg.experiments.confirm_report import sentence
    rows = c.ours(root, f"mini/{confirm.GRID}.csv")
    fig = c.plt.figure(figsize=(11, 9))  # two rows: readable at a notebook's width
    grid = fig.add_gridspec(2, 2)
    ax = [fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])]
    if rows is None:
        for a in ax:
            c.note(a, "not run yet (`tg mini run confirm`, results/mini/confirm.md)")
        return fig
    differences(ax[0], rows)
    ax[0].set_title("each seed's tree − chain, both starts averaged", fontsize=FONT + 1)
    for a, start in zip(ax[1:], confirm.STARTS):
        horizon(a, rows, start)
    fig.suptitle(f"Confirmatory experiment, fresh seeds (tg, cpu preset; error bars: 95% t intervals)\n"
                 f"{textwrap.fill(sentence(root), 100)}", fontsize=FONT + 1)
    fig.tight_layout()
    return fig
