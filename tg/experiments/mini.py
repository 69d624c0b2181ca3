"""The paper's claims in miniature: the named experiment grids on the cpu preset, and their files.

An experiment is a list of cells (a name, config overrides, labels) run for several seeds; a training cell is
evaluated at several steps. Its rows live in `results/mini/<experiment>.csv`, one per (cell, seed, evaluation
point), beside `steps/<experiment>.csv` (per-step metrics) and `questions/<experiment>.csv` (per-question
outcomes); each (cell, seed, step) is there once. `tg.experiments.runner` runs the missing rows and
`tg.experiments.measure` says what a row holds.

The two starting regimes are declared here, before any result was seen (results/mini/README.md, protocol):
- `moderate`: the default warm-up (multi-hop demonstrations 30%, half of them stopping one hop early);
- `hard`: 95% of the multi-hop demonstrations stop one hop early, so the warmed-up policy rarely
  completes a multi-hop chain (criterion, checked before any RL run: greedy multi-hop EM <= 5% on the
  300 test questions), the regime of the paper's 1.5B multi-hop rows. The first choice, 90%, gave
  6.0% (moderate: 12.7%) and was replaced before anything was trained.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tg.config import Config, ConfigError, load_config
from tg.store.files import append_csv_rows, checked_rows


REGIMES: dict[str, tuple[str, ...]] = {"moderate": (), "hard": ("warmup.early_stop_share=0.95",)}
"""Config overrides of each starting regime (the warm-up's difficulty knob)."""


def tree_shape(M: int, N: int, L: int) -> tuple[str, ...]:
    """Config overrides of the (M, N, L) tree; a chain of group G is (G, 0, 0)."""
    return (f"tree.M={M}", f"tree.N={N}", f"tree.L={L}")


CHAIN4, TREE221 = tree_shape(4, 0, 0), tree_shape(2, 2, 1)
SEEDS5, SEEDS3 = (0, 1, 2, 3, 4), (0, 1, 2)
POINTS = (30, 60)
"""Evaluation steps of every training cell (60 = the cpu preset's optim.steps)."""


LEDGER_SHAPES = [(2, 0, 0), (1, 2, 1), (4, 0, 0), (2, 2, 1), (8, 0, 0), (4, 2, 1), (2, 6, 1), (16, 0, 0),
                 (8, 2, 1), (6, 3, 1), (4, 5, 1)]
"""Table 3's (M, N, L) shapes; a chain of group G is (G, 0, 0)."""


@dataclass(frozen=True)
class Cell:
    """One configuration of an experiment and what to do with it."""

    name: str
    kind: str
    """'train' (train, evaluate at `points`), 'start' (evaluate the starting policy), 'ledger' (sample
    rollouts, count the budget) or 'theory' (Proposition 3.1 on a toy tree)."""
    overrides: tuple[str, ...] = ()
    seeds: tuple[int, ...] = SEEDS5
    points: tuple[int, ...] = (0,)
    labels: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def start_cell(regime: str, setting: str) -> Cell:
    """The starting policy's evaluation (step 0) for one regime and setting."""
    return Cell(f"{setting}/{regime}/start", "start", REGIMES[regime] + (f"data.setting={setting}",), seeds=(0,),
                labels=dict(method="start"))


def _train_cells(regime: str, setting: str, shapes: dict[str, tuple[str, ...]], advantage: str = "intra+inter",
                 seeds: tuple[int, ...] = SEEDS5, start: bool = True) -> list[Cell]:
    """One training cell per named shape (and, with `start`, the starting policy's evaluation)."""
    base = start_cell(regime, setting).overrides
    cells = [start_cell(regime, setting)] if start else []
    for method, shape in shapes.items():
        cells.append(Cell(f"{setting}/{regime}/{method}", "train", base + shape + (f"optim.advantage={advantage}",),
                          seeds=seeds, points=POINTS, labels=dict(method=method)))
    return cells


def experiments() -> dict[str, list[Cell]]:
    """The named grids. `budget`: claims 2 and 6 at the paper's budget 4 (chain G=4 vs tree (2,2,1)),
    multi-hop in both regimes and single-hop; `ledger`: claim 1; `theory`: claim 7; multi-hop in both regimes,
    `ablation` (claim 4, Table 4: intra / inter / both at 3 and 7 leaves per tree), `shapes` (claim 5, Table 7
    at budget 4) and `sweep` (claim 3, Table 3: chain G vs tree (G/2, 2, 1) at budgets 2, 4, 8, 16); beyond the
    paper, `branching`: chain 4, chain 4 with step groups, tree (2,2,1) with random and with entropy-guided nodes."""
    pair = {"chain": CHAIN4, "tree": TREE221}
    # 5 seeds per training cell (results/mini/README.md, protocol: seeds)
    budget = (_train_cells("moderate", "multi-hop", pair) + _train_cells("hard", "multi-hop", pair)
              + _train_cells("moderate", "single-hop", pair))
    ledger = [Cell(f"{regime}/({m},{n},{l})", "ledger", REGIMES[regime] + tree_shape(m, n, l),
                   seeds=SEEDS3, labels=dict(method="chain" if n == 0 else "tree"))
              for regime in REGIMES for m, n, l in LEDGER_SHAPES]
    theory = [Cell("toy-tree", "theory", seeds=tuple(range(20)))]
    # claims 3-5 (Tables 3, 4 and 7) from both starts: the hard start's cells were declared and run first
    # and the moderate start's were declared before any of them ran.
    # Cells whose configuration another grid ran (chain 4, (2,2,1), chain 8) are copied (`reuse_rows`).
    ablation, shapes, sweep = [], [], []
    for regime in ("hard", "moderate"):
        ablation += _train_cells(regime, "multi-hop", {"chain": CHAIN4, "chain-8": tree_shape(8, 0, 0)})
        for adv in ("intra", "inter", "intra+inter"):
            ablation += _train_cells(regime, "multi-hop", {f"{adv} (2,2,1)": TREE221,
                                                           f"{adv} (2,6,1)": tree_shape(2, 6, 1)}, advantage=adv, start=False)
        shapes += _train_cells(regime, "multi-hop", {f"({m},{n},{l})": tree_shape(m, n, l)
                                                     for m, n, l in [(4, 0, 0), (2, 2, 1), (2, 1, 2), (1, 5, 1)]})
        sweep += _train_cells(regime, "multi-hop", {f"chain-{g}": tree_shape(g, 0, 0) for g in (2, 4, 8, 16)})
        sweep += _train_cells(regime, "multi-hop", {f"tree ({m},{n},{l})": tree_shape(m, n, l)
                                                    for m, n, l in [(1, 2, 1), (2, 2, 1), (4, 2, 1), (8, 2, 1)]}, start=False)
    # beyond the paper (results/mini/README.md, protocol): where to branch at equal budget;
    # chain and tree are the budget grid's runs (copied)
    branching = []
    for regime in ("hard", "moderate"):
        branching += _train_cells(regime, "multi-hop", {"chain": CHAIN4, "chain+steps": CHAIN4 + ("optim.step_groups=1.0",),
                                                        "tree": TREE221, "tree-entropy": TREE221 + ("tree.node_rule=entropy",)})
    from tg.experiments import confirm  # the confirmatory grid (results/mini/confirm.md): its own module
    return {"budget": budget, "ledger": ledger, "theory": theory, "ablation": ablation, "shapes": shapes,
            "sweep": sweep, "branching": branching, confirm.GRID: confirm.cells()}


def select_cells(name: str, wanted: list[str] | None = None) -> list[Cell]:
    """The cells of experiment `name`, or (with `wanted`) only those named: a full name or its last parts
    ("chain-16" in both starts, "moderate/chain-16" in one), so a long grid can run in pieces of whole cells."""
    grids = experiments()
    if name not in grids:
        raise ConfigError(f"unknown experiment {name!r}; choose one of {sorted(grids)}")
    if not wanted:
        return grids[name]
    def named(cell: Cell, w: str) -> bool:
        return cell.name == w or cell.name.endswith("/" + w)
    unknown = [w for w in wanted if not any(named(c, w) for c in grids[name])]
    if unknown:
        raise ConfigError(f"--cell {unknown[0]!r} is not a cell of {name}; its cells: "
                          f"{', '.join(repr(c.name) for c in grids[name])}")
    return [c for c in grids[name] if any(named(c, w) for w in wanted)]


def describe(name: str | None = None) -> str:
    """The cells of one experiment (or all): name, kind, seeds, evaluation points, config overrides."""
    grids = experiments()
    lines = []
    for exp in [name] if name in grids else grids:
        lines.append(f"[{exp}]")
        for c in grids[exp]:
            pts = ",".join(map(str, c.points)) if c.kind == "train" else "-"
            stage = f"stage {c.labels['stage']:<10}" if "stage" in c.labels else ""
            lines.append(f"  {c.name:<36}{c.kind:<7} seeds {len(c.seeds):>2}  steps {pts:<6} {stage}{' '.join(c.overrides)}")
    return "\n".join(lines)


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


def cell_config(cell: Cell, seed: int, base: Config | None = None) -> Config:
    return (base or load_config("cpu")).with_overrides(*cell.overrides, f"optim.seed={seed}")


def regime_of(cell: Cell) -> str:
    """The starting regime whose overrides the cell carries (moderate: none)."""
    return next((r for r, o in REGIMES.items() if o and set(o) <= set(cell.overrides)), "moderate")
