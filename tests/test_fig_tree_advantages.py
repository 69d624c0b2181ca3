"""The README's tree figure: its committed data is what `tg.advantage` computes for the toy trees."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from figures import fig_tree_advantages as fig

ROOT = Path(__file__).resolve().parents[1]


def test_committed_data_is_what_tg_advantage_computes(tmp_path):
    (tmp_path / "results").mkdir()
    fresh = pd.read_csv(fig.write_data(tmp_path))
    committed = pd.read_csv(ROOT / "results" / fig.DATA)
    pd.testing.assert_frame_equal(fresh, committed)


def test_toy_advantages_keep_the_invariants():
    df = pd.read_csv(ROOT / "results" / fig.DATA)
    leaves = df.dropna(subset=["reward"])
    assert len(leaves) == 6 and (leaves.groupby("tree").size() == 3).all()      # (2,2,1): 2 trees of 1 + 2 leaves
    assert abs(leaves["inter"].sum()) < 1e-3                                       # inter: zero-sum over the prompt
    assert (leaves.groupby("tree")["intra"].sum().abs() < 1e-3).all()              # intra: zero-sum within a tree
    assert ((leaves["intra"] + leaves["inter"] - leaves["total"]).abs() < 1e-3).all()  # Eq. 7
    roots = df[df["parent"] == -1].set_index("tree")["net"]
    assert ((roots - leaves.groupby("tree")["total"].sum()).abs() < 1e-3).all()   # a root collects all its leaves



def test_labels_are_tick_size_and_text_sits_on_a_pale_fill():
    import matplotlib.colors as mcolors

    drawn = fig.draw(ROOT)
    texts = [t for ax in drawn.axes for t in ax.texts if t.get_text()]
    tick = fig.c.plt.rcParams["xtick.labelsize"]
    assert len(texts) == 14 + 6 and min(t.get_fontsize() for t in texts) >= tick  # 14 nodes, 6 leaf notes: none small
    fills = [t.get_bbox_patch().get_facecolor() for t in texts if t.get_bbox_patch() is not None]
    assert min(sum(mcolors.to_rgb(f)) / 3 for f in fills) > 0.6                   # black/navy text on light boxes
    fig.c.plt.close(drawn)
