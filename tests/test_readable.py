"""Every figure the notebooks show is readable at a notebook's width: its smallest text renders at >= 9 px.

JupyterLab and nbconvert's HTML show an output image scaled to fit about 940 CSS px, so text of s points in a
figure saved at d dpi and W px wide renders at s * d / 72 * min(1, 940 / W) px. The figure scripts and tg's
drawing functions are drawn here and measured; the figures a notebook draws in its own cells are read from
their source (figsize, set_size_inches, fontsize, labelsize), without running the notebook.
"""

from __future__ import annotations

import ast
import importlib
import io
import json
import struct
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.text import Text

from tg.agent.protocol import Action, Step
from tg.config import load_config
from tg.experiments import plots
from tg.tree import NODE_RULES, Tree

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `figures` is a folder of scripts, not part of the installed `tg` package
from figures import SCRIPTS  # noqa: E402
from figures import _common as c  # noqa: E402

NOTEBOOK_WIDTH_PX = 940
MIN_TEXT_PX = 9.0
INLINE_DPI = 100          # matplotlib's figure.dpi, at which the inline backend draws a notebook's figures
DEFAULT_POINTS = 10.0     # matplotlib's font.size: ticks, labels and legends without a size of their own
M = load_config("cpu").tree.M
NOTEBOOK_NAMES = {"M": M, "grown": NODE_RULES, "trees": range(M)}
"""The values a notebook's figure size is computed from, as the CPU preset sets them."""


def rendered_px(points: float, dpi: float, width_px: float) -> float:
    """The on-screen height of `points`-point text in a `width_px`-wide image saved at `dpi`, shown at a
    notebook's width."""
    return points * dpi / 72 * min(1.0, NOTEBOOK_WIDTH_PX / width_px)


def smallest_text(fig: plt.Figure, dpi: float) -> tuple[float, str]:
    """(rendered px, text) of the figure's smallest visible text, saved as the notebooks show it (tight box)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    width_px = struct.unpack(">I", buf.getvalue()[16:20])[0]   # the PNG header's width field
    points, text = min((t.get_fontsize(), t.get_text()) for t in fig.findobj(Text)
                       if t.get_visible() and t.get_text().strip())
    plt.close(fig)
    return rendered_px(points, dpi, width_px), text


def test_the_formula_on_the_issue_numbers():
    assert rendered_px(10, 120, 1964) == pytest.approx(7.98, abs=0.01)   # a 1x3 figure 16.4 inches wide
    assert rendered_px(10, 100, 800) == pytest.approx(13.9, abs=0.1)     # narrower than the notebook: unscaled


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_figure_script_is_readable_at_notebook_width(name):
    px, text = smallest_text(importlib.import_module(f"figures.{name}").draw(ROOT), c.DPI)
    assert px >= MIN_TEXT_PX, f"figures/{name}.py: {text!r} renders at {px:.1f} px at a notebook's width"


def _step(end: bool) -> Step:
    return Step([5] * 20, [] if end else [90], Action("answer" if end else "search", "who founded it"), end)


def test_tg_drawings_are_readable_at_notebook_width():
    tree = Tree(0, [1, 2])
    first = tree.add_path(0, [_step(False), _step(False), _step(True)])
    tree.add_path(1, [_step(False), _step(True)])
    tree.add_path(2, [_step(True)])
    tree.rewards = {leaf: float(k % 2) for k, leaf in enumerate(tree.leaves())}
    ax = plots.draw_tree(tree, advantages=[0.5] * len(tree.nodes), notes={first: "H=1.20"})
    assert smallest_text(ax.figure, INLINE_DPI)[0] >= MIN_TEXT_PX
    rows = [dict(step=s, reward=0.1 * s, em=0.1 * s, tool_calls_per_traj=1.0) for s in range(1, 4)]
    axes = plots.learning_curves({"chain": rows, "tree": rows}, keys=("reward", "em", "tool_calls_per_traj"))
    assert smallest_text(axes[0].figure, INLINE_DPI)[0] >= MIN_TEXT_PX


def _cell_figures(source: str) -> list[tuple[float, float]]:
    """(width in inches, smallest font in points) of each figure a code cell sizes: its `figsize=` or
    `set_size_inches(...)`, against every `fontsize=` / `labelsize=` in the cell, matplotlib's default size,
    and `plots.TEXT_SIZE` where the cell draws a tree."""
    tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
    widths, sizes = [], [DEFAULT_POINTS] + [float(plots.TEXT_SIZE)] * ("draw_tree(" in source)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr == "set_size_inches":
            widths.append(node.args[0])
        for kw in node.keywords:
            if kw.arg == "figsize":
                widths.append(kw.value.elts[0])
            elif kw.arg in ("fontsize", "labelsize") and isinstance(kw.value, ast.Constant):
                sizes.append(float(kw.value.value))
    return [(eval(compile(ast.Expression(w), "<figsize>", "eval"), {"len": len}, NOTEBOOK_NAMES), min(sizes))
            for w in widths]


def test_the_cell_reader_finds_sizes_and_widths():
    assert _cell_figures("fig, ax = plt.subplots(1, 3, figsize=(5 * M, 4))\nax[0].legend(fontsize=8)") == [(5 * M, 8)]
    assert _cell_figures("plt.gcf().set_size_inches(13, 3.8)\ndraw_tree(t, ax=a)") == [(13, plots.TEXT_SIZE)]


@pytest.mark.parametrize("notebook", sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb")))
def test_every_figure_a_notebook_draws_is_readable_at_notebook_width(notebook):
    cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
    for k, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        for width, points in _cell_figures("".join(cell["source"])):
            px = rendered_px(points, INLINE_DPI, width * INLINE_DPI)
            assert px >= MIN_TEXT_PX, (f"{notebook} cell {k}: a {width:g}-inch figure with {points:g}-point text "
                                       f"renders it at {px:.1f} px: fewer panels per row, or larger text")
