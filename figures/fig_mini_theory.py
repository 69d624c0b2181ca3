"""The miniature of claim 7: Proposition 3.1 checked on random toy trees and policies.

Reads results/mini/theory.csv alone (`tg mini run theory`): for each seed, the largest absolute
difference between autograd's intra-tree GRPO gradient and p(win) p(loss) g, between step-level DPO's
and p(loss) g, and between the two gradients' ratio and p(win) (tg.theory). Exact in float64 means
differences at round-off, drawn on a log scale beside the gradient's size. Writes
figures/fig_mini_theory.png.
"""

from __future__ import annotations

from pathlib import Path


from figures import _common as c

NAME = "fig_mini_theory.png"
ERRORS = {"intra_err": "|grad intra - p(win) p(loss) g|", "dpo_err": "|grad DPO - p(loss) g|",
          "ratio_err": "|grad intra - p(win) grad DPO|"}


def draw(root: Path):
    df = c.ours(root, "mini/theory.csv")
    fig, ax = c.plt.subplots(figsize=(7, 4))
    if df is None:
        c.note(ax, "tg miniature: not run yet\n(`tg mini run theory`)")
        return fig
    for (col, label), marker in zip(ERRORS.items(), "os^"):
        ax.scatter(df["p_win"], df[col].clip(lower=1e-18), marker=marker, s=18, label=f"max {label}")
    ax.scatter(df["p_win"], df["grad_scale"], marker="x", color="k", s=18, label="|g| (for scale)")
    ax.set_yscale("log")
    ax.set_xlabel("p(win) of the random toy policy")
    ax.set_ylabel("largest absolute difference (float64)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"{c.tg_label(df.assign(preset='toy'))}: Proposition 3.1 on {len(df)} random toy trees\n"
                 "intra-tree GRPO gradient = p(win) x step-level DPO gradient, to round-off")
    fig.tight_layout()
    return fig

