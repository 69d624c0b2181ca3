"""Table 6 of arXiv 2509.21240: tree nodes at the token/sentence level vs at the agent-step level.

Paper only (results/paper/table6_node_granularity_em.csv, Qwen2.5-3b): tg builds agent-step-level
trees only, so it has no token-level row to show beside it. Writes figures/fig_table6_granularity.png.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from figures import _common as c

NAME = "fig_table6_granularity.png"
COLUMNS = {"single_hop_avg": "single-hop avg", "multi_hop_avg": "multi-hop avg"}


def load(root: Path) -> pd.DataFrame:
    """(method, single-hop avg, multi-hop avg), as printed."""
    return c.paper(root, "table6_node_granularity_em").set_index("method")[list(COLUMNS)].rename(columns=COLUMNS)


def draw(root: Path):
    fig, ax = c.plt.subplots(figsize=(7, 3.8))
    c.grouped_bars(ax, load(root).T, [c.CHAIN_COLOR, "#fdae6b", c.TREE_COLOR])
    ax.set_ylabel("EM (x100)")
    ax.legend(loc="upper right")
    ax.set_ylim(0, 62)
    ax.set_title(f"Table 6: where a tree branches, {c.PAPER}, Qwen2.5-3b\n(no tg counterpart: tg trees branch "
                 "at agent steps only)")
    fig.tight_layout()
    return fig

