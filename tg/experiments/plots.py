"""Pictures: a tree of agent steps, and learning curves. matplotlib only (no system binaries)."""

from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence

import matplotlib.pyplot as plt

from tg.tree import Tree


def _layout(tree: Tree) -> dict[int, tuple[float, float]]:
    """x = leaf order (parents centred over their children), y = -depth."""
    pos: dict[int, tuple[float, float]] = {}
    counter = [0.0]

    def place(n: int) -> float:
        kids = tree.nodes[n].children
        x = sum(place(k) for k in kids) / len(kids) if kids else counter[0]
        if not kids:
            counter[0] += 1
        pos[n] = (x, -tree.nodes[n].depth)
        return x
    place(0)
    return pos


def node_label(tree: Tree, n: int, width: int = 18) -> str:
    """'prompt', 'search: <query>', 'answer: <text>' or the action kind, shortened."""
    step = tree.nodes[n].step
    if step is None:
        return "prompt"
    text = f"{step.action.kind}: {step.action.argument}" if step.action.argument else step.action.kind
    return text if len(text) <= width else text[: width - 1] + "…"


TEXT_SIZE = 10
"""Every label of a tree figure: matplotlib's tick size, so it stays legible at a notebook's display width."""


def leaf_colour(reward: float) -> tuple[float, float, float, float]:
    """A light red (reward 0) to light green (reward 1) fill, pale enough for black text on it."""
    r, g, b, _ = plt.get_cmap("RdYlGn")(0.5 + 0.5 * max(-1.0, min(1.0, 2 * reward - 1)))
    return (0.45 * r + 0.55, 0.45 * g + 0.55, 0.45 * b + 0.55, 1.0)


def draw_tree(tree: Tree, advantages: Mapping[int, float] | Sequence[float] | None = None, ax: Any = None,
              title: str | None = None, picked: Collection[int] = (), notes: Mapping[int, str] | None = None) -> Any:
    """Draw one tree: steps as nodes (query or answer shown), leaves coloured by reward (light red 0 ->
    light green 1), each node's effective advantage under it when given, and a bar of shared vs
    generated tokens (tokens every leaf would repeat without the tree, vs tokens sampled).
    `picked` nodes get a thick blue frame (e.g. where expansions started); `notes[n]` is written above node n.
    Text is `TEXT_SIZE`; labels sit on white so the edges never cross them."""
    pos = _layout(tree)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 2.0 * len(tree.leaves())), 1.3 * (1 + max(n.depth for n in tree.nodes))))
    for node in tree.nodes[1:]:
        (x0, y0), (x1, y1) = pos[node.parent], pos[node.id]
        ax.plot([x0, x1], [y0, y1], color="0.7", lw=1, zorder=1)
    on_white = dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.9)
    for node in tree.nodes:
        x, y = pos[node.id]
        r = tree.rewards.get(node.id)
        color = leaf_colour(r) if node.is_leaf and r is not None else "white"
        frame = dict(ec="tab:blue", lw=2.4) if node.id in picked else dict(ec="0.3", lw=0.8)
        ax.text(x, y, node_label(tree, node.id, width=14), ha="center", va="center", fontsize=TEXT_SIZE, zorder=3,
                bbox=dict(boxstyle="round,pad=0.3", fc=color, **frame))
        if notes and node.id in notes:
            ax.text(x, y + 0.22, notes[node.id], ha="center", va="bottom", fontsize=TEXT_SIZE, color="0.25",
                    zorder=2, bbox=on_white)
        if advantages is not None and node.id > 0:
            ax.text(x, y - 0.24, f"A={advantages[node.id]:+.2f}", ha="center", va="top", fontsize=TEXT_SIZE,
                    color="navy", fontweight="bold", zorder=2, bbox=on_white)
    ax.set_xlim(-0.7, max(x for x, _ in pos.values()) + 0.7)
    ax.set_ylim(min(y for _, y in pos.values()) - 0.75, 0.45 + 0.25 * bool(notes))
    ax.axis("off")
    sampled = sum(len(n.step.gen_ids) for n in tree.nodes[1:])
    as_chains = sum(tree.trajectory(leaf).policy_tokens for leaf in tree.leaves())
    ax.set_title(title or f"{len(tree.leaves())} leaves: {sampled} policy tokens sampled,\n"
                 f"{as_chains} if every leaf were its own chain", fontsize=TEXT_SIZE)
    return ax


CURVE_LABELS = {"reward": "training reward (mean over leaves)", "em": "training EM (sampled leaves)",
                "tool_calls_per_traj": "tool calls per trajectory"}
"""Axis labels of `learning_curves` for the metrics it is usually given (tg.metrics.METRICS defines them)."""


def learning_curves(histories: Mapping[str, Sequence[Mapping[str, float]]], keys: Sequence[str] = ("reward", "em"),
                    ax: Any = None) -> Any:
    """Plot metric curves (rows of metrics.jsonl) of several runs, one subplot per key."""
    if ax is None:
        _, ax = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.2))
    axes = list(ax) if hasattr(ax, "__len__") else [ax]
    for a, key in zip(axes, keys):
        for name, rows in histories.items():
            a.plot([r["step"] for r in rows], [r[key] for r in rows], label=name)
        a.set_xlabel("training step")
        a.set_ylabel(CURVE_LABELS.get(key, key))
        a.grid(alpha=0.3)
    axes[0].legend()
    return axes
