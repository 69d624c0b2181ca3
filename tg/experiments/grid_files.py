"""A grid's files: `results/mini/<experiment>.csv` (one row per cell, seed and evaluation point), beside it
`steps/<experiment>.csv` (per-step metrics) and `questions/<experiment>.csv` (per-question outcomes); each
(cell, seed, step) is in each file once. And what they say is still to do: the jobs of the missing rows, and the
rows another grid has already made.
"""

from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tg.experiments.cells import Cell, cell_config
from tg.store.files import append_csv_rows, checked_rows


def mini_dir(root: str | Path | None = None) -> Path:
    """results/mini/ under `root` (default: this checkout)."""
    from tg.agent.world import resolve
    return (Path(root) if root else resolve(".")) / "results" / "mini"


def steps_path(path: Path) -> Path:
    """The per-step metrics beside a grid's CSV: results/mini/steps/<grid>.csv."""
    return path.parent / "steps" / path.name


GRID_KEY = ("cell", "seed", "step")
"""What names a row of a grid's CSV (and of its steps/ and questions/ files): each key is there once."""


def row_key(row: dict) -> tuple[str, int, int]:
    return str(row["cell"]), int(row["seed"]), int(row["step"])


def grid_rows(path: Path) -> list[dict]:
    """The rows of a grid file (values as str), checked (`tg.store.files.checked_rows`): a torn last row is left
    out with a warning; a wrong header, another malformed row or a (cell, seed, step) written twice is refused."""
    return checked_rows(path, GRID_KEY, ints=("seed", "step"))[1]


def read_grid(path: Path) -> pd.DataFrame:
    """A grid file's checked rows (`grid_rows`) as a DataFrame, typed as pandas reads the CSV."""
    header, rows = checked_rows(path, GRID_KEY, ints=("seed", "step"))
    if not header:
        return pd.DataFrame()
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=header)
    w.writeheader()
    w.writerows(rows)
    return pd.read_csv(io.StringIO(out.getvalue()))


def append_grid_rows(path: Path, rows: list[dict]) -> None:
    """Append rows to a grid file, refusing any whose (cell, seed, step) is already there."""
    append_csv_rows(path, rows, key=GRID_KEY)


def done_keys(path: Path) -> set[tuple[str, int, int]]:
    """(cell, seed, step) of the rows already in the CSV (a torn last row is not done)."""
    return {row_key(r) for r in grid_rows(path)}


def questions_path(path: Path) -> Path:
    """The per-question outcomes beside a grid's CSV: results/mini/questions/<grid>.csv."""
    return path.parent / "questions" / path.name


def question_outcomes(result: Any, questions: list[Any]) -> dict:
    """One evaluation's test questions, compact: `correct` (one 0/1 character per question) and `searches` (one
    digit per question), single-hop questions first, in test-set order; `ids` a hash of that order."""
    from tg.agent.data import is_single_hop
    if sorted({float(x) for x in result.scores} - {0.0, 1.0}) or max(result.tool_calls, default=0) > 9:
        raise ValueError("question outcomes hold 0/1 scores and at most 9 searches per question")
    n_single = sum(is_single_hop(s) for s in result.sources)
    return {"n_single": n_single, "ids": hashlib.sha256("\n".join(q.id for q in questions).encode()).hexdigest()[:12],
            "correct": "".join(str(int(x)) for x in result.scores), "searches": "".join(map(str, result.tool_calls))}


def outcome_vector(row: Any, part: str, column: str = "correct") -> np.ndarray:
    """One question-level row's outcomes of `part` ('single' or 'multi') as an integer array."""
    digits = np.array([int(c) for c in str(row[column])])
    n_single = int(row["n_single"])
    return digits[:n_single] if part == "single" else digits[n_single:]


def run_lock(root: Path, name: str) -> Path:
    """The lock file a run of grid `name` under `root` holds: runs/mini/<name>.lock, beside the runs' checkpoints,
    which two runs of one grid would write at once too."""
    return root / "runs" / "mini" / f"{name}.lock"


@dataclass(frozen=True)
class Job:
    experiment: str
    cell: Cell
    seed: int
    points: tuple[int, ...]
    """The evaluation points still missing from the CSV."""


def pending_jobs(experiment: str, cells: list[Cell], path: Path) -> list[Job]:
    """Every (cell, seed) with a missing row; ordered seed-major so a partial grid has whole seeds."""
    done = done_keys(path)
    jobs = []
    for seed in sorted({s for c in cells for s in c.seeds}):
        for c in cells:
            missing = tuple(p for p in c.points if (c.name, seed, p) not in done)
            if seed in c.seeds and missing:
                jobs.append(Job(experiment, c, seed, missing))
    return sorted(jobs, key=lambda j: j.cell.kind != "start")  # starting policies first: the cheapest rows


def reuse_rows(cells: list[Cell], path: Path) -> list[dict]:
    """Copy into `path` the missing (cell, seed, point) rows whose configuration (config hash, hence seed
    too) another experiment's CSV beside it has evaluated: the same run, not re-trained. Each copy keeps its
    measurements and provenance, takes this cell's name and labels, and names its source in `reused_from`."""
    found: dict[tuple[str, str], dict] = {}
    for other in sorted(path.parent.glob("*.csv")):
        if other != path:
            for r in grid_rows(other):
                if r.get("config_hash") and r.get("em_multi"):  # evaluated rows only (not ledger rows)
                    found.setdefault((r["config_hash"], r["step"]), {**r, "reused_from": r.get("reused_from") or other.stem})
    done, rows = done_keys(path), []
    for c in cells:
        for seed in c.seeds if c.kind in ("train", "start") else ():
            key = cell_config(c, seed).hash()
            rows += [{**found[key, str(p)], "cell": c.name, **c.labels} for p in c.points
                     if (c.name, seed, p) not in done and (key, str(p)) in found]
    if rows:
        append_grid_rows(path, rows)
    copy_steps(path)
    return rows


def copy_steps(path: Path) -> int:
    """Give every training run whose rows `path` copied from another grid (`reused_from`) its per-step metrics in
    this grid's steps file too, renamed to this grid's cell, so each grid's steps file holds every run of that
    grid. The source run is the one of the same config hash and seed in the grid named by `reused_from`.
    Returns the number of step rows written."""
    rows = [r for r in grid_rows(path) if r.get("reused_from") and r.get("method") != "start" and r.get("train_s")]
    if not rows:
        return 0
    have = {(c, s) for c, s, _ in done_keys(steps_path(path))}
    new: list[dict] = []
    for (cell, seed), r in {(r["cell"], int(r["seed"])): r for r in rows}.items():
        if (cell, seed) in have:
            continue
        source = path.parent / f"{r['reused_from']}.csv"
        names = {x["cell"] for x in grid_rows(source) if x.get("config_hash") == r["config_hash"]
                 and int(x["seed"]) == seed and x.get("method") != "start"}
        steps = [x for x in grid_rows(steps_path(source)) if names and x["cell"] == min(names) and int(x["seed"]) == seed]
        new += [{**x, "cell": cell} for x in sorted(steps, key=lambda x: int(x["step"]))]
    if new:
        append_grid_rows(steps_path(path), new)
    return len(new)
