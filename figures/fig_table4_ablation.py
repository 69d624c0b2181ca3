"""Table 4 of arXiv 2509.21240: which advantage (intra-tree, inter-tree, both) at budgets of about 4 and 8.

Top: the paper (results/paper/table4_advantage_ablation_em.csv, Qwen2.5-3b, multi-hop avg EM);
the run that collapsed (intra only with 3 leaves per tree) is a zero bar marked "collapse". Below, one panel
per start: the tg miniature (results/mini/ablation.csv: budget, advantage or method, M, N, L, seed, em_multi,
optionally `collapsed`), mean ± standard error over the seeds that did not
collapse; a cell without rows is marked
"not run yet".
Writes figures/fig_table4_ablation.png.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from figures import _common as c

NAME = "fig_table4_ablation.png"
# the paper's row names and tg's `optim.advantage` values -> one name (tg's), then the label drawn
CANON = {"intra_only": "intra", "inter_only": "inter", "intra_plus_inter": "intra+inter"}
LABELS = {"chain": "chain GRPO", "intra": "intra-tree only", "inter": "inter-tree only",
          "intra+inter": "intra + inter (Tree-GRPO)"}
COLORS = {"chain": c.CHAIN_COLOR, "intra": "#fdae6b", "inter": "#e6550d", "intra+inter": "#a63603"}


def _advantage(df: pd.DataFrame) -> pd.Series:
    """The `advantage` column, else the last word of tg's method name ('Tree-GRPO (2,2,1) intra')."""
    if "advantage" in df:
        adv = df["advantage"].astype(str)
    else:
        adv = df["method"].astype(str).map(lambda m: "chain" if m.lower().startswith("chain") else m.split()[-1])
    return adv.replace(CANON)


def load(root: Path) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(budget, advantage, shape, mean, std, se, count, collapsed): the paper's, and ours or None."""
    p = c.paper(root, "table4_advantage_ablation_em")
    paper = p.assign(advantage=_advantage(p), mean=pd.to_numeric(p["multi_hop_avg"], errors="coerce"), std=0.0,
                     se=0.0, count=1, collapsed=p["multi_hop_avg"].astype(str).eq("collapse").astype(int))
    mini = c.ours(root, "mini/ablation.csv")
    if mini is None:
        return _with_shape(paper), None
    mini = c.final_rows(c.trained(mini).assign(advantage=_advantage(mini)), ["budget", "advantage"])
    gone = mini.get("collapsed", pd.Series(False, index=mini.index)).astype(str).str.lower().isin(["1", "true"])
    keys = ["budget", "advantage", "M", "N", "L"] + (["regime"] if "regime" in mini else [])
    ours = c.seed_stats(mini[~gone], keys, "em_multi").merge(
        mini.assign(collapsed=gone).groupby(keys, dropna=False)["collapsed"].sum().reset_index(), how="right")
    return _with_shape(paper), _with_shape(ours.assign(label=c.tg_label(mini)))


def _with_shape(df: pd.DataFrame) -> pd.DataFrame:
    """Each budget's tree shape, for the x label: '≈4, tree (2,2,1)'."""
    tree = df[df["advantage"] != "chain"].groupby("budget").first()
    names = {b: f"budget ≈{b:g}\ntree {c.shape(r['M'], r['N'], r['L'])}" for b, r in tree.iterrows()}
    return df.assign(group=df["budget"].map(names).fillna(df["budget"].map(lambda b: f"budget ≈{b:g}")))


def panel(ax, df: pd.DataFrame) -> None:
    groups = list(dict.fromkeys(df.sort_values("budget")["group"]))
    advs = [a for a in LABELS if a in set(df["advantage"])]
    w = 0.8 / len(advs)
    for k, adv in enumerate(advs):
        s = df[df["advantage"] == adv].set_index("group").reindex(groups)
        xs = np.arange(len(groups)) + (k - (len(advs) - 1) / 2) * w
        bars = ax.bar(xs, s["mean"].fillna(0), w, yerr=s["se"].where(s["count"] > 1), capsize=3,
                      color=COLORS[adv], label=LABELS[adv])
        c.bar_labels(ax, bars, inside=bool((s["count"] > 1).any()))
        for x, (_, r) in zip(xs, s.iterrows()):
            _mark(ax, x, r)
    ax.set_xticks(np.arange(len(groups)), groups)
    ax.grid(axis="y", alpha=0.3)


def _mark(ax, x: float, r: pd.Series) -> None:
    """No row for the cell: "not run yet" at its place. Every seed collapsed: a zero bar marked x and "collapse";
    some seeds: "k of n collapsed" above the bar."""
    k = r["collapsed"]
    if pd.isna(k):
        ax.text(x, ax.get_ylim()[1] * 0.04, "not run yet", rotation=90, ha="center", va="bottom",
                color="0.4")
    if not k > 0:
        return
    if pd.isna(r["mean"]):
        ax.plot(x, 0, marker="x", color="crimson", ms=9, mew=2, clip_on=False)
        ax.text(x, ax.get_ylim()[1] * 0.04, "collapse" + (f" ({k:.0f} seeds)" if k > 1 else ""), rotation=90,
                ha="center", va="bottom", color="crimson")
    else:
        ax.annotate(f"{k:.0f} of {k + r['count']:.0f}\nseeds\ncollapsed", (x, r["mean"] + r["se"]), ha="center",
                    va="bottom", color="crimson", xytext=(0, 2), textcoords="offset points")


def draw(root: Path):
    paper, ours = load(root)
    fig, top, below = c.paper_above_starts(ours)
    panel(top, paper)
    top.set_title(f"{c.PAPER}, Qwen2.5-3b: multi-hop avg")
    top.set_ylabel("EM (x100)")
    top.set_ylim(0, paper["mean"].max() * 1.15)
    for ax, regime, df in below:
        if df is None:
            c.note(ax, "tg miniature: not run yet\n(see results/mini/README.md)")
            continue
        panel(ax, df)
        ax.set_title(f"{ours['label'].iloc[0]} miniature,{c.start_title(regime)}:\nmulti-hop EM, mean over "
                     f"{c.seed_count(df['count'] + df['collapsed'])} seeds")
        ax.set_ylabel("EM (x100)")
    fig.suptitle("Table 4: advantage ablation (top: paper; below: tg, a different model and world)\n"
                 + c.ERROR_BARS)
    handles, labels = top.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncols=4, bbox_to_anchor=(0.5, -0.03))
    fig.tight_layout()
    return fig

