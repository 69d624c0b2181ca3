"""Tree-GRPO's advantages on one toy prompt: M=2 trees, N=2 expansions per tree, L=1 round.

Each leaf shows its outcome reward and its intra-tree, inter-tree and total advantage (Eq. 6-7 of
arXiv 2509.21240, docs/paper.md#advantages); each inner node shows its net push, the sum of its
descendant leaves' totals (docs/paper.md#shared-prefixes).

Reads results/toy_tree_advantages.csv: one row per node (tree, node, parent, step, depth; reward, intra,
inter, total for leaves; net for every node). `python -m figures.fig_tree_advantages --write-data` writes
that file from the toy trees below, computing every number with `tg.advantage` (the only step that imports
`tg`; drawing reads the CSV alone, as every figure does). Writes figures/fig_tree_advantages.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from figures import _common as c

NAME = "fig_tree_advantages.png"
DATA = "toy_tree_advantages.csv"
TREES = (
    # (parent, step) per node, in creation order; node 0 is the prompt. A seed chain of three steps
    # (nodes 1-3), then N=2 branches from two of its non-leaf steps.
    ((-1, "prompt"), (0, "search"), (1, "search"), (2, "answer"), (1, "search"), (4, "answer"), (2, "answer")),
    ((-1, "prompt"), (0, "search"), (1, "search"), (2, "answer"), (1, "answer"), (2, "search"), (5, "answer")),
)
REWARDS = ({3: 0.0, 5: 1.0, 6: 0.0}, {3: 0.0, 4: 0.0, 6: 0.0})
"""Leaf -> outcome reward (1 = right answer), per tree: one right leaf, under a second search in tree 1; tree 2
all wrong, so it has no intra-tree signal and only the inter-tree part pushes its leaves down."""
TEXT = 11
"""Every label's font size: at least the tick size of `figures._common`, legible at a notebook's width."""


def write_data(root: Path) -> Path:
    """Compute the toy prompt's advantages with `tg.advantage` (defaults of `tg.config.OptimConfig`) and write
    `<root>/results/toy_tree_advantages.csv`."""
    import torch

    from tg.advantage import node_advantages, tree_grpo_parts

    leaves = [(t, leaf) for t, rewards in enumerate(REWARDS) for leaf in sorted(rewards)]
    rewards = torch.tensor([REWARDS[t][leaf] for t, leaf in leaves], dtype=torch.float64)
    tree_ids = torch.tensor([t for t, _ in leaves])
    adv = tree_grpo_parts(rewards, tree_ids, torch.zeros_like(tree_ids), mode="intra+inter")
    per_leaf = {key: (r, i, o, s) for key, r, i, o, s in
                zip(leaves, rewards.tolist(), adv.intra.tolist(), adv.inter.tolist(), adv.total.tolist())}
    rows = []
    for t, nodes in enumerate(TREES):
        parents = [p for p, _ in nodes]
        net = node_advantages(parents, {leaf: per_leaf[(t, leaf)][3] for leaf in REWARDS[t]})
        for n, (parent, step) in enumerate(nodes):
            depth = 0 if parent < 0 else next(r["depth"] for r in rows if r["tree"] == t and r["node"] == parent) + 1
            r, intra, inter, total = per_leaf.get((t, n), (None,) * 4)
            rows.append(dict(tree=t, node=n, parent=parent, step=step, depth=depth, reward=r, intra=intra,
                             inter=inter, total=total, net=net[n]))
    path = root / "results" / DATA
    pd.DataFrame(rows).round(4).to_csv(path, index=False)
    return path


def _x_positions(nodes: pd.DataFrame) -> dict[int, float]:
    """Leaves left to right in depth-first order, each parent centred over its children."""
    children = {n: list(nodes.loc[nodes["parent"] == n, "node"]) for n in nodes["node"]}
    pos: dict[int, float] = {}
    next_leaf = [0.0]

    def place(n: int) -> float:
        kids = children[n]
        pos[n] = sum(place(k) for k in kids) / len(kids) if kids else next_leaf[0]
        next_leaf[0] += 0 if kids else 1
        return pos[n]
    place(int(nodes.loc[nodes["parent"] == -1, "node"].iloc[0]))
    return pos


def _fill(reward: float) -> tuple[float, ...]:
    """A pale red (0) to pale green (1) fill that black text reads on."""
    rgb = c.plt.get_cmap("RdYlGn")(0.1 + 0.8 * reward)[:3]
    return tuple(0.45 * v + 0.55 for v in rgb)


def _draw_tree(ax, nodes: pd.DataFrame, title: str) -> None:
    x = _x_positions(nodes)
    by_id = nodes.set_index("node")
    for n, row in by_id.iterrows():
        if row["parent"] >= 0:
            ax.plot([x[row["parent"]], x[n]], [-by_id.loc[row["parent"], "depth"], -row["depth"]], color="0.7",
                    lw=1, zorder=1)
    for n, row in by_id.iterrows():
        leaf = not pd.isna(row["reward"])
        face = _fill(row["reward"]) if leaf else "white"
        inner = not leaf and row["parent"] >= 0   # an inner step: its net push is written in its box
        label = f"{row['step']}\nnet {row['net']:+.2f}" if inner else row["step"]
        ax.text(x[n], -row["depth"], label, ha="center", va="center", fontsize=TEXT, zorder=3,
                color="navy" if inner else "black", bbox=dict(boxstyle="round,pad=0.3", fc=face, ec="0.3", lw=0.8))
        if leaf:   # under the leaf, clear of every edge (leaves have none below them)
            text = (f"R = {row['reward']:g}\nintra {row['intra']:+.2f}\ninter {row['inter']:+.2f}\n"
                    f"total {row['total']:+.2f}")
            ax.text(x[n], -row["depth"] - 0.3, text, ha="center", va="top", fontsize=TEXT, family="monospace",
                    zorder=2)
    ax.set_xlim(min(x.values()) - 0.6, max(x.values()) + 0.6)
    ax.set_ylim(-by_id["depth"].max() - 1.9, 0.4)
    ax.axis("off")
    ax.set_title(title, fontsize=TEXT + 1)


def draw(root: Path):
    df = c.ours(root, DATA)
    if df is None:
        fig, ax = c.plt.subplots(figsize=(7, 3))
        c.note(ax, "no data yet\n(`python -m figures.fig_tree_advantages --write-data`)")
        return fig
    trees = sorted(df["tree"].unique())
    fig, axes = c.plt.subplots(1, len(trees), figsize=(5.2 * len(trees), 5.6))
    for ax, t in zip(axes, trees):
        nodes = df[df["tree"] == t]
        leaves = nodes.dropna(subset=["reward"])
        _draw_tree(ax, nodes, f"tree {t + 1}: {len(leaves)} leaves, mean reward {leaves['reward'].mean():.2f}")
    all_leaves = df.dropna(subset=["reward"])
    fig.suptitle(f"Tree-GRPO advantages of one prompt (M=2, N=2, L=1: {len(all_leaves)} leaves, budget 4 chains)\n"
                 "intra: normalised within its tree; inter: within the prompt's "
                 f"{len(all_leaves)} leaves; total = intra + inter (Eq. 7)\nnet: the sum of the totals of "
                 "the leaves below a node", fontsize=TEXT + 1)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=f"Draw figures/{NAME} from results/{DATA}.")
    p.add_argument("--root", type=Path, default=c.ROOT, help="repository root holding results/ (default: this repo)")
    p.add_argument("--write-data", action="store_true", help=f"first compute results/{DATA} with tg.advantage")
    args = p.parse_args(argv)
    root = args.root.resolve()
    if args.write_data:
        print(write_data(root))
    path = c.save(draw(root), root, NAME)
    print(path)
    return path


if __name__ == "__main__":
    main()
