"""The miniature's headline (claims 2 and 6): chain GRPO (G=4) vs Tree-GRPO (2,2,1) at the
paper's budget of about 4, multi-hop from a moderate and a hard-exploration start, and single-hop.

Reads results/mini/budget.csv alone (`tg mini run budget`). Top row: greedy test EM against training
step for each setting and regime, every seed a thin line, the mean ± standard error over seeds thick
(`_common.ERROR_BARS`); the starting policy is step 0. Bottom row: EM and searches per test question at
the final step (mean ± standard error over the seeds that reached it, each seed a dot). The paper's
budget-4 numbers (Qwen2.5-3b, Table 3) are written beside ours as text, labelled.
Writes figures/fig_mini_budget.png.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from figures import _common as c

NAME = "fig_mini_budget.png"
PANELS = [("multi-hop", "moderate", "em_multi"), ("multi-hop", "hard", "em_multi"), ("single-hop", "moderate", "em_single")]
COLORS = {"chain": c.CHAIN_COLOR, "tree": c.TREE_COLOR}
LABELS = {"chain": "chain GRPO, G=4", "tree": "Tree-GRPO (2,2,1)"}


def load(root: Path) -> pd.DataFrame | None:
    """Our rows with the starting policy's row copied to step 0 of every (method, seed) of its panel."""
    df = c.ours(root, "mini/budget.csv")
    if df is None:
        return None
    start, runs = df[df["method"] == "start"], df[(df["method"] != "start") & (df["step"] > 0)]
    copies = [s.to_frame().T.assign(method=m, seed=seed) for _, s in start.iterrows()
              for m, seed in runs[(runs["setting"] == s["setting"]) & (runs["regime"] == s["regime"])]
              [["method", "seed"]].drop_duplicates().itertuples(index=False)]
    out = pd.concat([runs, *copies], ignore_index=True)
    for col in ("step", "seed", "em_single", "em_multi", "calls_multi", "calls_single"):
        out[col] = pd.to_numeric(out[col])
    return out


def paper_budget4(root: Path) -> dict[str, tuple[float, float]]:
    """The paper's Table 3 at budget ≈4 (Qwen2.5-3b): {hop: (chain, tree)} averages."""
    t3 = c.paper(root, "table3_budget_em")
    at4 = t3[t3["budget"] == 4].set_index("method")
    return {h: (at4.loc["Chain", col], at4.loc["Tree", col])
            for h, col in (("multi-hop", "multi_hop_avg"), ("single-hop", "single_hop_avg"))}


def curves(ax, df: pd.DataFrame, value: str) -> None:
    for method, color in COLORS.items():
        d = df[df["method"] == method]
        if d.empty:
            continue
        for _, s in d.groupby("seed"):
            s = s.sort_values("step")
            ax.plot(s["step"], s[value], color=color, alpha=0.25, lw=0.8)
        g = d.groupby("step")[value].agg(["mean", "sem"]).reset_index()
        ax.errorbar(g["step"], g["mean"], yerr=g["sem"].fillna(0), color=color, lw=2, capsize=3, marker="o",
                    label=f"{LABELS[method]} ({d['seed'].nunique()} seeds)")
    ax.set_xlabel("training step")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def final_bars(ax, df: pd.DataFrame, value: str, fmt: str) -> None:
    """Mean ± standard error over seeds at the final evaluation step (seeds still running are left out), per panel and
    method; per-seed dots on top."""
    last = df[df["step"] == df["step"].max()]
    x = np.arange(len(PANELS))
    for k, (method, color) in enumerate(COLORS.items()):
        means, ses = [], []
        for i, (setting, regime, _) in enumerate(PANELS):
            v = last[(last["setting"] == setting) & (last["regime"] == regime) & (last["method"] == method)][value]
            means.append(v.mean() if len(v) else 0.0)
            ses.append(v.sem() if len(v) > 1 else 0.0)
            ax.scatter(np.full(len(v), i + (k - 0.5) * 0.4), v, s=8, color="k", zorder=3)
        bars = ax.bar(x + (k - 0.5) * 0.4, means, 0.4, yerr=ses, capsize=3, color=color, label=LABELS[method])
        c.bar_labels(ax, bars, fmt=fmt, inside=True)
    ax.set_xticks(x, [f"{s}\n{r} start" for s, r, _ in PANELS])
    ax.grid(axis="y", alpha=0.3)


def draw(root: Path):
    df = load(root)
    fig, ax = c.plt.subplot_mosaic([["c0", "c0", "c1", "c1", "c2", "c2"], ["em"] * 3 + ["calls"] * 3],
                                   figsize=(12.5, 9.5))   # 12.5 inches: 10-point ticks >= 9 px at notebook width
    if df is None:
        for a in ax.values():
            c.note(a, "tg miniature: not run yet\n(`tg mini run budget`, see results/mini/README.md)")
        return fig
    paper = paper_budget4(root)
    for a, (setting, regime, value) in zip((ax["c0"], ax["c1"], ax["c2"]), PANELS):
        curves(a, df[(df["setting"] == setting) & (df["regime"] == regime)], value)
        ch, tr = paper[setting]
        a.set_title(f"{setting} EM, {regime} start\n(paper, Qwen2.5-3b at ≈4:\nchain {ch}, tree {tr})")
        a.set_ylabel(f"greedy {setting} test EM (x100)")
    ax["c0"].legend(loc="lower right")
    step = int(df["step"].max())
    final_bars(ax["em"], df.assign(em=np.where(df["setting"] == "single-hop", df["em_single"], df["em_multi"])),
               "em", "{:.1f}")
    ax["em"].set_ylabel("greedy test EM (x100)")
    ax["em"].set_title(f"EM at step {step}, dots = seeds")
    final_bars(ax["calls"], df.assign(calls=np.where(df["setting"] == "single-hop", df["calls_single"],
                                                     df["calls_multi"])), "calls", "{:.2f}")
    ax["calls"].set_ylabel(f"searches per test question at step {step}")
    ax["calls"].set_title("searches per question (claim 6; the paper's Fig. 5 shows more\n"
                          "actions per question under tree training)")
    ax["calls"].legend(loc="upper right")   # above the single-hop bars, the lowest
    fig.suptitle(f"{c.tg_label(df)} miniature of Table 3 at budget ≈4: chain GRPO vs Tree-GRPO (2,2,1) = "
                 "2 (1 + 2/2) = 4 chains;\nsame 60-step schedule, seeds and test sets. "
                 "tg's tiny model and synthetic world are not the paper's:\n"
                 f"compare directions, not numbers. Paper numbers: {c.PAPER}, Table 3.\n{c.ERROR_BARS}")
    fig.tight_layout()
    return fig
