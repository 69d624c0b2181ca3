"""What every figure script shares: where the data lives, how it is read, labelled and saved.

Results are data, figures are code. A figure script reads only CSVs:
- `results/paper/*.csv`: the PAPER's numbers (arXiv 2509.21240 v3, transcribed; see
  `results/paper/README.md`), always labelled `PAPER`;
- `results/*.csv`, `results/mini/*.csv`: rows that `tg` measured, labelled `tg (<preset>)` (their dates and
  git shas stay in the rows, not in the titles).

Readable at notebook width: text no smaller than the tick labels (`matplotlib.rcParams` below), figures
narrow enough that 10-point ticks at `DPI` render at 9 px or more when shown 940 px wide (at most about 14.5
inches: two rows rather than three or four panels in one), and one error-bar convention, `ERROR_BARS`: the
standard error of the mean over seeds.

EM and F1 are percentages (x100) everywhere, as printed in the paper and as `tg.evaluate.result_row`
writes them. This module imports matplotlib, pandas and numpy only (never torch), so
`python -m figures` takes seconds.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display; set before pyplot is imported anywhere
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams.update({"font.size": 11, "axes.titlesize": 11, "axes.labelsize": 11, "xtick.labelsize": 10,
                     "ytick.labelsize": 10, "legend.fontsize": 10, "figure.titlesize": 12})
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from tg.agent.data import SETTINGS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
"""The repository root: scripts read `<root>/results/` and write `<root>/figures/`."""

PAPER = "paper (arXiv 2509.21240)"
DPI = 120
"""Every PNG here is saved at this resolution (`save`)."""
ERROR_BARS = "error bars: ± 1 standard error of the mean over seeds"
"""The one error-bar convention of every figure over seeds, written on each such figure."""
CHAIN_COLOR, TREE_COLOR = "tab:blue", "tab:orange"
SINGLE_HOP, MULTI_HOP = SETTINGS["single-hop"][1], SETTINGS["multi-hop"][1]
"""The paper's test sets of each setting (Table 1's two halves)."""


def paper(root: Path, name: str) -> pd.DataFrame:
    """One of the paper's tables, `results/paper/<name>.csv`, as printed."""
    return pd.read_csv(root / "results" / "paper" / f"{name}.csv")


def ours(root: Path, relpath: str) -> pd.DataFrame | None:
    """A CSV of `tg` results under `results/`, or None when it is absent or has no rows."""
    path = root / "results" / relpath
    if not path.exists():
        return None
    df = pd.read_csv(path)
    return df if len(df) else None


def span(df: pd.DataFrame, col: str) -> str:
    """The column's one value, or its range 'first..last' when the rows differ; '?' when absent."""
    vals = sorted(df[col].dropna().astype(str).unique()) if col in df else []
    return "?" if not vals else vals[0] if len(vals) == 1 else f"{vals[0]}..{vals[-1]}"


def tg_label(df: pd.DataFrame) -> str:
    """'tg (<preset>)' from the rows' provenance column; the dates stay in the rows (`span(df, "date")`)."""
    return f"tg ({span(df, 'preset')})"


def trained(df: pd.DataFrame) -> pd.DataFrame:
    """Training rows only: without `tg mini`'s starting-policy rows (`method` "start")."""
    return df[df["method"].astype(str) != "start"] if "method" in df else df


def final_rows(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The last evaluation point of each cell: its rows at the largest `step` per `keys`. A seed whose run
    has not reached that step yet (a grid in progress) is left out rather than drawn from an earlier step.

    Files without a `step` column are returned as they are (one row per cell and seed)."""
    if "step" not in df:
        return df
    last = df.groupby([k for k in keys if k in df], dropna=False)["step"].transform("max")
    return df[df["step"] == last]


def by_start(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """`tg mini`'s rows split by starting regime, the hard start first; rows without a `regime` column are
    one group named '' (as are rows whose regime is empty)."""
    regime = df["regime"].fillna("").astype(str) if "regime" in df else pd.Series("", index=df.index)
    present = set(regime)
    order = [r for r in ("hard", "moderate") if r in present] + sorted(present - {"hard", "moderate"})
    return [(r, df[regime == r]) for r in order]


def paper_above_starts(ours: pd.DataFrame | None
                       ) -> tuple[plt.Figure, plt.Axes, list[tuple[plt.Axes, str, pd.DataFrame | None]]]:
    """A figure of two rows of 4.2 inch high panels, 5.5 inches wide per start: the paper's panel across the
    top, one tg panel per starting regime (`by_start`) below, or one panel for 'not run yet' when `ours` is
    None. Two starts make it 11 inches wide, readable at a notebook's width. Returns (figure, top axes,
    [(axes, regime, rows)]), rows None for the empty panel."""
    starts = by_start(ours) if ours is not None else [("", None)]
    fig = plt.figure(figsize=(5.5 * max(2, len(starts)), 8.8))
    grid = fig.add_gridspec(2, len(starts))
    top = fig.add_subplot(grid[0, :])
    return fig, top, [(fig.add_subplot(grid[1, k]), regime, rows) for k, (regime, rows) in enumerate(starts)]


def start_title(regime: str) -> str:
    """' hard start' for a regime's panel title; '' when the rows name none."""
    return f" {regime} start" if regime else ""


def seed_stats(df: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """Mean, std, standard error (`se`, the one the figures draw; 0 for one seed) and number of seeds of
    `value` per cell, at the cell's last step; per starting regime too where the rows have one (runs from
    different starts are never pooled)."""
    keys = keys + ["regime"] if "regime" in df and "regime" not in keys else keys
    rows = final_rows(df, keys)
    out = rows.groupby(keys, dropna=False)[value].agg(["mean", "std", "count"]).reset_index()
    out["std"] = out["std"].fillna(0.0)
    out["se"] = out["std"] / np.sqrt(out["count"])
    return out


def seed_count(counts: pd.Series) -> str:
    """'5' when every cell has as many seeds, else the range: '3-5'."""
    lo, hi = int(counts.min()), int(counts.max())
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def shape(m: float, n: float, l: float) -> str:
    """'(M,N,L)' with integers; a chain (N and L empty or 0) reads '(M,0,0)'."""
    n, l = (0 if pd.isna(v) else v for v in (n, l))
    return f"({int(m)},{int(n)},{int(l)})"


def note(ax: plt.Axes, text: str) -> None:
    """An empty panel that says why it is empty."""
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=11, wrap=True, transform=ax.transAxes,
            bbox=dict(boxstyle="round", fc="0.95", ec="0.7"))
    ax.set_xticks([])
    ax.set_yticks([])


def bar_labels(ax: plt.Axes, bars, fmt: str = "{:.1f}", size: float = 10, inside: bool = False) -> None:
    """Each bar's value above it, or inside it where error bars stand above (the figure doubles as the
    table). Zero-height bars get no label."""
    labels = [fmt.format(b.get_height()) if b.get_height() else "" for b in bars]
    if inside:
        ax.bar_label(bars, labels=labels, fontsize=size, label_type="center", color="white", fontweight="bold")
    else:
        ax.bar_label(bars, labels=labels, fontsize=size, padding=1)


def grouped_bars(ax: plt.Axes, mean: pd.DataFrame, colors: list[str], std: pd.DataFrame | None = None,
                 fmt: str = "{:.1f}") -> None:
    """Bars grouped by `mean`'s rows (x ticks), one bar per column (the legend label), values on them.

    mean, std: (groups, series); `std` is the error bar's half-length (the figures pass the standard error).
    Error bars (and values inside the bars) only where `std` is given."""
    w = 0.8 / mean.shape[1]
    x = np.arange(len(mean))
    for k, col in enumerate(mean.columns):
        err = None if std is None else std[col]
        bars = ax.bar(x + (k - (mean.shape[1] - 1) / 2) * w, mean[col], w, yerr=err, capsize=3,
                      color=colors[k % len(colors)], label=str(col))
        bar_labels(ax, bars, fmt=fmt, inside=err is not None)
    ax.set_xticks(x, [str(i) for i in mean.index])
    ax.grid(axis="y", alpha=0.3)


def legend(ax: plt.Axes, axes, **kw) -> None:
    """One legend on `ax` for the labelled artists of all `axes` (each label once)."""
    seen: dict[str, object] = {}
    for a in np.ravel(axes):
        for h, lab in zip(*a.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    ax.legend(list(seen.values()), list(seen), **kw)


def save(fig: plt.Figure, root: Path, name: str) -> Path:
    """Write `<root>/figures/<name>` and close the figure."""
    path = root / "figures" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path



def mean_of(df: pd.DataFrame, cols: tuple[str, ...]) -> pd.Series:
    """Row-wise mean of `cols`, NaN unless every one of them is present and filled."""
    if not all(c in df for c in cols):
        return pd.Series(np.nan, index=df.index)
    return df[list(cols)].astype(float).mean(axis=1, skipna=False)
