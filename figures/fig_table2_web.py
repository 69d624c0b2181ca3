"""Table 2 of arXiv 2509.21240: web-agent QA (F1) with a real web search, Qwen2.5-7b and 14b.

Paper only (results/paper/table2_web_f1.csv): tg's search agent uses a local corpus, so it has no
web rows to show beside it. The 32b direct-inference reference rows are left out.
Writes figures/fig_table2_web.png.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from figures import _common as c

NAME = "fig_table2_web.png"
MODELS = ("Qwen2.5-7b", "Qwen2.5-14b")
COLUMNS = {"simpleqa": "SimpleQA", "gaia_avg": "GAIA avg", "webwalker_avg": "WebWalker avg",
           "browsecomp": "BrowseComp"}
COLORS = ["0.6", c.CHAIN_COLOR, c.TREE_COLOR]  # ReAct, GRPO, Tree-GRPO


def load(root: Path) -> pd.DataFrame:
    """The rows of MODELS: (model, method, one F1 column per benchmark), as printed."""
    df = c.paper(root, "table2_web_f1")
    return df[df["model"].isin(MODELS)][["model", "method", *COLUMNS]].rename(columns=COLUMNS)


def draw(root: Path):
    df = load(root)
    fig, axes = c.plt.subplots(1, len(MODELS), figsize=(12, 4), sharey=True)
    for ax, model in zip(axes, MODELS):
        c.grouped_bars(ax, df[df["model"] == model].set_index("method")[list(COLUMNS.values())].T, COLORS)
        ax.set_title(model)
    axes[0].set_ylabel("F1 (x100)")
    axes[0].legend(loc="upper right")
    fig.suptitle(f"Table 2: web-agent QA, {c.PAPER} (no tg counterpart: tg searches a local corpus)")
    fig.tight_layout()
    return fig

