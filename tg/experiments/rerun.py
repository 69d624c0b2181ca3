"""Rerun one committed row of a `tg mini` grid and show the new numbers beside the committed ones.

A training row is retrained from its pinned start with its cell's configuration (the config hash must equal
the committed one) and compared step by step with the committed per-step metrics (results/mini/steps/), then
at its evaluation points with the committed EMs. On the CPU kind that made the rows, every value is equal;
another instruction set changes float sums, so values drift apart after some steps (docs/testing.md).

    tg mini rerun results/mini/budget.csv multi-hop/hard/tree 0            # the whole run, both evaluations
    tg mini rerun budget multi-hop/hard/tree 0 --steps 2                   # its first two steps only

A whole grid rerun into another root (`tg mini run GRID --root DIR`) is compared with the committed one row by row,
every column but provenance and wall-clock seconds, with `tg mini compare GRID --root DIR` (or `tg mini compare
DIR/results/mini/GRID.csv`).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tg.agent.data import DataError
from tg.config import ConfigError
from tg.experiments.cells import Cell, cell_config
from tg.experiments.grid_files import grid_rows, mini_dir, steps_path
from tg.experiments.mini import experiments
from tg.experiments.runner import GRID_THREADS
from tg.metrics import METRICS, TIMERS

COMPARED_STEP = tuple(k for k in METRICS if k not in TIMERS and k != "step")
"""Per-step metrics compared: every one but the step number and the wall-clock timers."""
COMPARED_EVAL = ("em_single", "em_multi", "calls_single", "calls_multi")


@dataclass(frozen=True)
class Committed:
    """The committed rows of one (cell, seed): the grid CSV, its evaluation rows and its per-step metrics."""

    path: Path
    cell: Cell
    seed: int
    rows: dict[int, dict]
    steps: dict[int, dict]


def grid_csv(grid_or_csv: str, root: str | Path | None = None) -> Path:
    """A grid name (results/mini/<name>.csv under `root` or this checkout) or a CSV path."""
    path = Path(grid_or_csv)
    if path.suffix != ".csv":
        path = mini_dir(root) / f"{grid_or_csv}.csv"
    if not path.exists():
        raise DataError(f"{path}: no such grid file; name a grid of `tg mini list` or a results/mini/*.csv file")
    return path


def committed(path: Path, cell_name: str, seed: int) -> Committed:
    """The committed rows of (cell, seed) in `path`; a row copied from another grid (`reused_from`) is looked up
    where it was trained (`source_cell`)."""
    grid = path.stem
    cells = {c.name: c for c in experiments().get(grid, [])}
    if cell_name not in cells:
        raise ConfigError(f"{cell_name!r} is not a cell of grid {grid!r}; its cells: {', '.join(map(repr, cells))}")
    rows = {int(r["step"]): r for r in grid_rows(path) if r["cell"] == cell_name and int(r["seed"]) == seed}
    if not rows:
        raise DataError(f"{path}: no row of cell {cell_name!r} with seed {seed}")
    source = next(iter(rows.values())).get("reused_from")
    if source:
        src_path = path.parent / f"{source}.csv"
        return committed(src_path, source_cell(src_path, cell_name, seed, rows), seed)
    steps = {int(r["step"]): r for r in grid_rows(steps_path(path)) if r["cell"] == cell_name and int(r["seed"]) == seed}
    return Committed(path, cells[cell_name], seed, rows, steps)


def source_cell(src_path: Path, cell_name: str, seed: int, rows: dict[int, dict]) -> str:
    """The cell of `src_path` whose rows `rows` (cell `cell_name`, `seed`) were copied from: a row the source grid
    made itself with the same config hash, seed and step; the same cell name first. By steps, not by hash alone:
    a start cell (step 0) can share a training cell's configuration."""
    h = next(iter(rows.values()))["config_hash"]
    found = [r["cell"] for r in grid_rows(src_path) if r["config_hash"] == h and int(r["seed"]) == seed
             and int(r["step"]) in rows and not r.get("reused_from")]
    if not found:
        raise DataError(f"{src_path}: no row of config {h} seed {seed} at steps {sorted(rows)}, where the rows of "
                        f"{cell_name!r} were copied from")
    return cell_name if cell_name in found else found[0]


def _same(committed_value: str, value: float) -> bool:
    """A committed CSV value (written as Python's repr of the float) against a fresh one, exactly."""
    if committed_value in ("", None):
        return False
    c = float(committed_value)
    return c == value or (math.isnan(c) and math.isnan(value))


@dataclass(frozen=True)
class Rerun:
    """What a rerun found: whether every compared value equals the committed one, the fresh per-step
    metrics, and the committed rows."""

    equal: bool
    steps: list[dict]
    committed: Committed


def rerun(path: Path, cell_name: str, seed: int, steps: int | None = None, run_dir: str | Path | None = None,
          out: Callable[[str], None] = print) -> Rerun:
    """Retrain (cell, seed) to its evaluation points, or to `steps` only, comparing each step's metrics and
    each evaluation with the committed values."""
    from tg.experiments.measure import eval_columns
    from tg.pipeline import build_run, evaluate_model
    if steps is not None and steps < 1:
        raise ConfigError(f"--steps {steps}: a rerun trains and compares at least the first step; leave --steps out to "
                          "rerun the whole run")
    c = committed(path, cell_name, seed)
    cfg = cell_config(c.cell, seed)
    made = next(iter(c.rows.values()))["config_hash"]
    if made != cfg.hash():
        raise ConfigError(f"{c.path}: {c.cell.name} seed {seed} was made with config {made}, this checkout's cell is "
                          f"{cfg.hash()} (another configuration or code path): it cannot be rerun exactly here")
    if c.cell.kind != "train":
        raise ConfigError(f"{c.cell.name} is a {c.cell.kind} cell; tg mini rerun retrains training rows")
    if not c.steps:
        raise DataError(f"{steps_path(c.path)}: no per-step metrics of {c.cell.name} seed {seed} to compare with")
    points = sorted({p for p in c.cell.points if steps is None or p <= steps} | ({steps} if steps else set()))
    run = build_run(cfg, run_dir or tempfile.mkdtemp(prefix="tg-rerun-"))
    from tg.agent.warmup import machine, torch_threads
    made_on = next(iter(c.rows.values())).get("machine") or "an unrecorded machine"
    out(f"rerun of {c.path} {c.cell.name} seed {seed} (config {made}) in {run.trainer.run_dir}")
    out(f"committed on {made_on}; now on {machine()}")
    out("| step | reward committed | reward now | grad_norm committed | grad_norm now | metrics equal |")
    out("|---|---|---|---|---|---|")
    equal, done, metrics = True, 0, []
    with torch_threads(GRID_THREADS):  # the grid's thread count: another sums floats in another order
        for p in points:
            metrics = run.trainer.fit(steps=p, resume=done > 0, progress=False)
            for m in metrics[done:]:
                ref = c.steps.get(m["step"], {})
                differ = [k for k in COMPARED_STEP if k in m and not _same(ref.get(k, ""), m[k])]
                equal &= not differ
                out(f"| {m['step']} | {ref.get('reward', '-')} | {m['reward']!r} | {ref.get('grad_norm', '-')} "
                    f"| {m['grad_norm']!r} | {'yes' if not differ else 'no: ' + ', '.join(differ)} |")
            done = p
            if p in c.rows:
                now = eval_columns(evaluate_model(run.trainer.policy.model, run.tokenizer, run.resources, cfg,
                                                  progress=False))
                pairs = ", ".join(f"{k} {c.rows[p][k]} -> {now[k]}" for k in COMPARED_EVAL)
                same = all(_same(c.rows[p][k], now[k]) for k in COMPARED_EVAL)
                equal &= same
                out(f"evaluation at step {p} (committed -> now): {pairs}: {'equal' if same else 'DIFFERENT'}")
    out(f"{'identical' if equal else 'not identical'} to the committed values")
    return Rerun(equal, metrics, c)


IGNORED = ("date", "git_sha", "machine", "eval_s", "train_s", "run_s", "seconds_per_q", "reused_from")
"""Grid columns a comparison skips: provenance and wall-clock seconds, which differ between any two runs."""


@dataclass(frozen=True)
class GridComparison:
    """A rerun grid's rows against the committed ones, matched on (cell, seed, step)."""

    grid: str
    kind: str
    """'rows' (the grid CSV) or 'steps' (its per-step metrics)."""
    matched: int
    identical: int
    """Matched rows equal in every compared column, to the last written digit."""
    missing: int
    """Committed rows the rerun does not have (not run yet)."""
    moved: dict[str, int]
    """Each compared column that differs somewhere: in how many matched rows."""
    examples: list[str]


def _keyed(path: Path) -> dict[tuple[str, str, str], dict]:
    """A grid file's checked rows (`grid_rows`: each key once) by (cell, seed, step)."""
    return {(r["cell"], r["seed"], r["step"]): r for r in grid_rows(path)}


def compare_rows(grid: str, kind: str, committed_csv: Path, rerun_csv: Path, skip: tuple[str, ...],
                 examples: int = 5) -> GridComparison:
    """Compare two CSVs of one grid row by row: every column but `skip`, as written (exactly)."""
    old, new = _keyed(committed_csv), _keyed(rerun_csv)
    both = [k for k in old if k in new]
    moved: dict[str, int] = {}
    shown: list[str] = []
    identical = 0
    for key in both:
        differ = [c for c in old[key] if c not in skip and c in new[key] and old[key][c] != new[key][c]]
        identical += not differ
        for c in differ:
            moved[c] = moved.get(c, 0) + 1
        if differ and len(shown) < examples:
            shown.append(f"{key[0]} seed {key[1]} step {key[2]}: " + ", ".join(
                f"{c} {old[key][c]} -> {new[key][c]}" for c in differ[:4]) + (" ..." if len(differ) > 4 else ""))
    return GridComparison(grid, kind, len(both), identical, len(old) - len(both), moved, shown)


def compare_grid(grid_or_csv: str, rerun_root: str | Path | None = None,
                 root: str | Path | None = None) -> list[GridComparison]:
    """The rows and per-step metrics of a rerun grid (a grid name under `rerun_root`, where `tg mini run GRID
    --root DIR` wrote, or a CSV such as /tmp/rerun/results/mini/budget.csv) against the committed ones of the same grid
    under `root` (default: this checkout). DataError when no row is in both: a comparison of nothing passes nothing."""
    new = grid_csv(grid_or_csv, rerun_root)
    old = mini_dir(root) / new.name
    if not old.exists():
        raise DataError(f"{old}: no committed grid {new.stem!r} to compare {new} with")
    if old.resolve() == new.resolve():
        raise ConfigError(f"{new} is the committed grid itself: name the rerun's CSV or its --root DIR")
    found = [compare_rows(new.stem, "rows", old, new, IGNORED),
             compare_rows(new.stem, "steps", steps_path(old), steps_path(new), IGNORED + TIMERS)]
    if not found[0].matched:
        raise DataError(f"{new} shares no (cell, seed, step) with the committed {old}: nothing to compare; run some of "
                        f"the grid into the rerun's root first (`tg mini run {new.stem} --root DIR`)")
    return found


def describe_comparison(c: GridComparison) -> str:
    """One paragraph: how many rows matched, how many are identical, which columns moved and examples."""
    what = "rows" if c.kind == "rows" else "per-step rows"
    lines = [f"{c.grid}, {what}: {c.identical} of {c.matched} identical"
             + (f"; {c.missing} committed not rerun yet" if c.missing else "")]
    if c.moved:
        lines.append("  moved: " + ", ".join(f"{k} ({n})" for k, n in sorted(c.moved.items(), key=lambda kv: -kv[1])))
        lines += [f"  {e}" for e in c.examples]
    return "\n".join(lines)
