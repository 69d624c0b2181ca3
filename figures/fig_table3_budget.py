"""Table 3 of arXiv 2509.21240: chain vs tree EM at budgets of about 2, 4, 8, 16 chain-equivalents.

Left: the paper (results/paper/table3_budget_em.csv, Qwen2.5-3b). Right: the tg miniature
(results/mini/budget.csv: budget, method, M, N, L, seed, em_single, em_multi, ...), mean ± standard error over
seeds at each seed's last evaluation step; each hop's EM comes from runs trained in that setting from
the moderate start. Tree shapes that share (N, L) across budgets are joined by a line (the paper's
(M, 2, 1) family); other shapes are single markers.
Writes figures/fig_table3_budget.png.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from figures import _common as c

NAME = "fig_table3_budget.png"
KEYS = ["budget", "kind", "M", "N", "L"]
HOPS = {"multi": ("multi_hop_avg", "em_multi"), "single": ("single_hop_avg", "em_single")}
MARKERS = "^vPXd*"


def _kind(df: pd.DataFrame) -> pd.Series:
    """'chain' for chain rows (method names 'chain...', or no N), else 'tree'."""
    chain = df["method"].astype(str).str.lower().str.startswith("chain") | df["N"].fillna(0).eq(0)
    return chain.map({True: "chain", False: "tree"})


def _trained_for(mini: pd.DataFrame, hop: str) -> pd.DataFrame:
    """`tg mini`'s rows (with `setting` and `regime` columns) trained in the hop's own setting, from the
    moderate start (the hard start is drawn in fig_mini_budget.png), without the starting-policy rows;
    files without those columns are used whole."""
    if "setting" not in mini:
        return mini
    keep = (mini["setting"] == f"{hop}-hop") & (mini["regime"] == "moderate") & (mini["method"] != "start")
    return mini[keep]


def load(root: Path) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Tidy tables (budget, kind, M, N, L, hop, mean, std, se, count): the paper's, and ours or None."""
    paper = c.paper(root, "table3_budget_em").assign(kind=lambda d: _kind(d))
    paper = pd.concat([paper[KEYS].assign(hop=h, mean=paper[col], std=0.0, se=0.0, count=1)
                       for h, (col, _) in HOPS.items()], ignore_index=True)
    mini = c.ours(root, "mini/budget.csv")
    if mini is None:
        return paper, None
    mini = mini.assign(kind=_kind(mini))
    ours = pd.concat([c.seed_stats(_trained_for(mini, h), KEYS, col).assign(hop=h) for h, (_, col) in HOPS.items()],
                     ignore_index=True)
    return (paper, None) if ours.empty else (paper, ours.assign(label=c.tg_label(mini)))


def _line(ax, df: pd.DataFrame, color: str, marker: str, label: str) -> None:
    """Means joined by a line, ± one standard error over seeds as a shaded band (bands overlap more readably
    than bars)."""
    df = df.sort_values("budget")
    if len(df) == 1:  # one budget: a band has no width, so an error bar
        ax.errorbar(df["budget"], df["mean"], yerr=df["se"], marker=marker, color=color, capsize=3, label=label)
        return
    ax.plot(df["budget"], df["mean"], marker=marker, color=color, label=label)
    ax.fill_between(df["budget"], df["mean"] - df["se"], df["mean"] + df["se"], color=color, alpha=0.15, lw=0)


def panel(ax, df: pd.DataFrame, budgets: list[float] | None = None) -> None:
    """Chain line; one line per tree (N, L) family present at several budgets; other shapes as markers.
    The axis shows `budgets` (default: those in `df`)."""
    _line(ax, df[df["kind"] == "chain"], c.CHAIN_COLOR, "o", "chain GRPO (G = budget)")
    tree = df[df["kind"] == "tree"]
    nudged: dict[float, int] = {}
    markers = iter(MARKERS * 3)
    for (n, l), fam in tree.groupby(["N", "L"], sort=False):
        if len(fam) > 1:
            _line(ax, fam, c.TREE_COLOR, "s", f"tree (M,{int(n)},{int(l)})")
            continue
        r = fam.iloc[0]  # one shape: nudged right so it does not hide the line's marker at its budget
        nudged[r["budget"]] = nudged.get(r["budget"], 0) + 1
        ax.errorbar(r["budget"] * 2 ** (0.14 * nudged[r["budget"]]), r["mean"], yerr=r["se"] or None, ls="none",
                    capsize=3, marker=next(markers), color=c.TREE_COLOR, ms=7,
                    label=f"tree {c.shape(r['M'], n, l)}")
    budgets = budgets or sorted(df["budget"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xlim(budgets[0] / 1.6, budgets[-1] * 1.6)
    ax.set_xticks(budgets, [f"≈{b:g}" for b in budgets])
    ax.minorticks_off()
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)   # headroom: no marker or error bar cut by the top edge
    ax.grid(alpha=0.3)


def draw(root: Path):
    paper, ours = load(root)
    layout = [["pmulti", "tmulti"], ["psingle", "tsingle"]] if ours is not None else [["pmulti", "t"], ["psingle", "t"]]
    fig, ax = c.plt.subplot_mosaic(layout, figsize=(11, 7.5))
    for hop in HOPS:
        a = ax[f"p{hop}"]
        panel(a, paper[paper["hop"] == hop])
        a.set_title(f"{c.PAPER}, Qwen2.5-3b: {hop}-hop avg")
        a.set_ylabel("EM (x100)")
        if ours is not None:
            s = ours[ours["hop"] == hop]
            if s.empty:
                c.note(ax[f"t{hop}"], f"tg miniature: no {hop}-hop rows yet")
                continue
            panel(ax[f"t{hop}"], s)
            ax[f"t{hop}"].set_title(f"{s['label'].iloc[0]} miniature: {hop}-hop EM,\nmean over {c.seed_count(s['count'])} seeds")
    ax["psingle"].set_xlabel("budget (chain-equivalent trajectories per prompt)")
    ax["pmulti"].legend(loc="lower right")
    if ours is None:
        c.note(ax["t"], "tg miniature: not run yet\n(see results/mini/README.md)")
    else:
        ax["tsingle"].set_xlabel("budget (chain-equivalent trajectories per prompt)")
        ax["tmulti"].legend(loc="lower right")
    fig.suptitle("Table 3: chain vs tree at equal budget (left: paper; right: tg, a different model and world)\n"
                 f"shaded: {c.ERROR_BARS.removeprefix('error bars: ')}")
    fig.tight_layout()
    return fig

