"""Rerun one committed row of a `tg mini` grid and show the new numbers beside the committed ones.

A training row is retrained from its pinned start with its cell's configuration (the config hash must equal
the committed one) and compared step by step with the committed per-step metrics (results/mini/steps/), then
at its evaluation points with the committed EMs. On the CPU kind that made the rows, every value is equal;
another instruction set changes float sums, so values drift apart after some steps (docs/testing.md).

    tg mini rerun results/mini/budget.csv multi-hop/hard/tree 0            # the whole run, both evaluations
    tg mini rerun budget multi-hop/hard/tree 0 --steps 2                   # its first two steps only
"""

from __future__ import annotations

import csv
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tg.agent.data import DataError
from tg.config import ConfigError
from tg.experiments.mini import GRID_THREADS, Cell, cell_config, experiments, mini_dir, steps_path
from tg.trainer import METRICS, TIMERS

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
    """The committed rows of (cell, seed) in `path`; a row copied from another grid (`reused_from`) is
    looked up where it was trained."""
    grid = path.stem
    cells = {c.name: c for c in experiments().get(grid, [])}
    if cell_name not in cells:
        raise ConfigError(f"{cell_name!r} is not a cell of grid {grid!r}; its cells: {', '.join(map(repr, cells))}")
    rows = {int(r["step"]): r for r in csv.DictReader(path.open())
            if r["cell"] == cell_name and int(r["seed"]) == seed}
    if not rows:
        raise DataError(f"{path}: no row of cell {cell_name!r} with seed {seed}")
    source = next(iter(rows.values())).get("reused_from")
    if source:
        src_path = path.parent / f"{source}.csv"
        h = next(iter(rows.values()))["config_hash"]
        src_cell = next(r["cell"] for r in csv.DictReader(src_path.open()) if r["config_hash"] == h)
        return committed(src_path, src_cell, seed)
    steps = {}
    if steps_path(path).exists():
        steps = {int(r["step"]): r for r in csv.DictReader(steps_path(path).open())
                 if r["cell"] == cell_name and int(r["seed"]) == seed}
    return Committed(path, cells[cell_name], seed, rows, steps)


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
    from tg.experiments.mini import _eval_columns
    from tg.pipeline import build_run, evaluate_model
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
                now = _eval_columns(evaluate_model(run.trainer.policy.model, run.tokenizer, run.resources, cfg,
                                                   progress=False))
                pairs = ", ".join(f"{k} {c.rows[p][k]} -> {now[k]}" for k in COMPARED_EVAL)
                same = all(_same(c.rows[p][k], now[k]) for k in COMPARED_EVAL)
                equal &= same
                out(f"evaluation at step {p} (committed -> now): {pairs}: {'equal' if same else 'DIFFERENT'}")
    out(f"{'identical' if equal else 'not identical'} to the committed values")
    return Rerun(equal, metrics, c)
