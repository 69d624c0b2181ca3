"""`make demo` as data: chain GRPO vs Tree-GRPO at equal budget, greedy test EM and tool calls by method.

Reads results/demo.csv (rows of `tg.experiments.demo.run_demo`: model, method, step, one EM column per test
set, e.g. synthetic_single and synthetic_multi, a calls_<set> column per test set, then preset,
config_hash, git_sha, seed, date, n; the newest row of each method and seed counts). Bars are the mean
over a method's seeds, error bars the standard error when there are several; the starting policy (method `start`,
step 0) is the grey bar. The synthetic world has no paper counterpart: no paper numbers.
Writes figures/fig_demo.png.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from figures import _common as c

NAME = "fig_demo.png"
START_COLOR = "0.6"
NOT_METRICS = {"model", "method", "step", "preset", "config_hash", "git_sha", "seed", "date", "n", "machine",
               "trajectories_per_q", "generated_per_q", "minutes"}


def load(root: Path) -> tuple[pd.DataFrame, list[str], list[str]] | None:
    """The demo rows, their EM columns and their tool-call columns; None when there are none."""
    df = c.ours(root, "demo.csv")
    if df is None:
        return None
    df = df.drop_duplicates(["method", "seed"], keep="last")  # a rerun of the same seed replaces the earlier row
    calls = [k for k in df if k.startswith("calls_")]
    em = [k for k in df if k not in NOT_METRICS and k not in calls]
    return df, em, calls


def _bars(ax, df: pd.DataFrame, cols: list[str], methods: list[str], ylabel: str, fmt: str) -> None:
    """Grouped bars: one group per column (test set), one bar per method; standard error over seeds where
    several."""
    g = df.groupby("method")[cols]
    seeds = g.size().loc[methods]
    names = {m: f"{m} ({seeds[m]} seed{'s' if seeds[m] > 1 else ''})" for m in methods}
    mean, std = (t.loc[methods].rename(index=names).T for t in (g.mean(), g.sem()))
    colors = [START_COLOR if m == "start" else c.CHAIN_COLOR if m.lower().startswith("chain") else c.TREE_COLOR
              for m in methods]
    c.grouped_bars(ax, mean.rename(index=lambda k: k.removeprefix("calls_")), colors,
                   std.rename(index=lambda k: k.removeprefix("calls_")) if (seeds > 1).any() else None, fmt)
    ax.set_ylabel(ylabel)


def draw(root: Path):
    data = load(root)
    if data is None:
        fig, ax = c.plt.subplots(figsize=(8, 2.2))
        c.note(ax, "no tg demo rows yet: `make demo` writes results/demo.csv")
        ax.set_title("make demo: chain GRPO vs Tree-GRPO at equal budget (tg only; no paper counterpart)")
        return fig
    df, em, calls = data
    fig, ax = c.plt.subplots(1, 2, figsize=(10, 4), width_ratios=[3, 2])
    methods = sorted(df["method"].astype(str).unique(),
                     key=lambda m: (m != "start", not m.lower().startswith("chain"), m))
    _bars(ax[0], df, em, methods, "greedy test EM (x100)", "{:.1f}")
    _bars(ax[1], df, calls, methods, "tool calls per question", "{:.2f}")
    ax[0].set_title("exact match by test set")
    ax[1].set_title("search calls by test set")
    handles, labels = ax[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncols=len(methods), bbox_to_anchor=(0.5, -0.07))
    steps = "/".join(str(s) for s in sorted(df.loc[df["method"] != "start", "step"].unique())) if "step" in df else "?"
    fig.suptitle(f"{c.tg_label(df)}, make demo: chain vs tree at equal budget after {steps} steps, "
                 f"{', '.join(sorted(df['model'].astype(str).unique()))} (no paper counterpart)"
                 + (f"\n{c.ERROR_BARS}" if (df.groupby("method").size() > 1).any() else ""))
    fig.tight_layout()
    return fig

