"""Table 1 of arXiv 2509.21240: single-hop and multi-hop average EM by method, Qwen2.5-1.5b and 3b.

Paper: results/paper/table1_qa_em.csv. Ours: rows of results/runs.csv (written by `tg train`) whose
`model` starts with "Qwen" (a run evaluated twice at a step counted once), averaged over seeds, drawn as black diamonds on the paper's bars.
Writes figures/fig_table1_qa.png.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from figures import _common as c

NAME = "fig_table1_qa.png"
MODELS = ("Qwen2.5-1.5b", "Qwen2.5-3b")
PAPER_LABEL = f"{c.PAPER}, as printed"
AVERAGES = {"single_hop_avg": c.SINGLE_HOP, "multi_hop_avg": c.MULTI_HOP}


def _paper_method(method: str) -> str | None:
    """tg's method names (`tg.pipeline.method_name`) -> the paper's Table 1 names."""
    if method.startswith("chain GRPO"):
        return "GRPO"
    return "Tree-GRPO" if method.startswith("Tree-GRPO") else None


def load(root: Path) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The paper's rows of MODELS; our Qwen rows as (model, method, average, mean, std, se, count)."""
    paper = c.paper(root, "table1_qa_em")
    paper = paper[paper["model"].isin(MODELS)].reset_index(drop=True)
    runs = c.ours(root, "runs.csv")
    if runs is None or not runs["model"].astype(str).str.startswith("Qwen").any():
        return paper, None
    runs = runs.drop_duplicates(["config_hash", "seed", "step"], keep="last")  # one run evaluated twice is one seed
    runs = runs[runs["model"].astype(str).str.startswith("Qwen")]
    size = runs["model"].str.lower().str.extract(r"(\d+(?:\.\d+)?)b", expand=False)  # Qwen/Qwen2.5-1.5B -> 1.5
    runs = runs.assign(model="Qwen2.5-" + size + "b", method=runs["method"].astype(str).map(_paper_method))
    runs = runs.dropna(subset=["model", "method"])
    stats = [c.seed_stats(runs.assign(**{avg: c.mean_of(runs, cols)}).dropna(subset=[avg]), ["model", "method"], avg)
             .assign(average=avg) for avg, cols in AVERAGES.items()]
    ours = pd.concat(stats, ignore_index=True)
    return paper, ours.assign(label=c.tg_label(runs)) if len(ours) else None


def draw(root: Path):
    paper, ours = load(root)
    methods = list(dict.fromkeys(paper["method"]))
    fig, axes = c.plt.subplots(1, len(MODELS), figsize=(12, 4.2), sharey=True)
    x, w = np.arange(len(methods)), 0.38
    for ax, model in zip(axes, MODELS):
        rows = paper[paper["model"] == model].set_index("method").loc[methods]
        for k, (avg, cols) in enumerate(AVERAGES.items()):
            hop = avg.split("_")[0]
            ax.bar(x + (k - 0.5) * w, rows[avg], w, color=("#9ecae1", "#3182bd")[k],
                          label=f"{PAPER_LABEL}: {hop}-hop avg")  # values: the table, one call away
            misprint = (rows[list(cols)].mean(axis=1) - rows[avg]).abs() > 0.15
            for i in np.flatnonzero(misprint.to_numpy()):
                ax.annotate("*", (x[i] + (k - 0.5) * w, rows[avg].iloc[i] + 2.5), ha="center", color="crimson")
        if ours is not None:
            _draw_ours(ax, ours[ours["model"] == model], methods, x, w)
        ax.set_title(model)
        ax.set_xticks(x, [m.replace(" ", "\n") for m in methods])
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("EM (x100)")
    axes[0].set_ylim(0, 62)
    c.legend(axes[0], axes, loc="upper left")
    foot = "* printed average differs from the mean of its columns (kept as printed; results/paper/README.md)."
    foot += "" if ours is not None else "   No tg rows yet (results/runs.csv has no Qwen rows)."
    fig.text(0.01, -0.02, foot, ha="left")
    who = f"bars: {PAPER_LABEL}" + ("; diamonds: tg" if ours is not None else "")
    fig.suptitle(f"Table 1: search-agent QA, average EM by method ({who})")
    fig.tight_layout()
    return fig


def _draw_ours(ax, ours: pd.DataFrame, methods: list[str], x: np.ndarray, w: float) -> None:
    for k, avg in enumerate(AVERAGES):
        s = ours[(ours["average"] == avg) & ours["method"].isin(methods)]
        xs = [x[methods.index(m)] + (k - 0.5) * w for m in s["method"]]
        ax.errorbar(xs, s["mean"], yerr=s["se"], fmt="D", color="black", ms=5, capsize=3,
                    label=f"{s['label'].iloc[0]}, mean ± standard error over seeds" if k == 0 and len(s) else None)
        for xi, m in zip(xs, s["mean"]):
            ax.annotate(f"{m:.1f}", (xi + 0.06, m), va="center")

