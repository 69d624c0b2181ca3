"""The paper's claims in miniature: named experiment grids on the cpu preset.

An experiment is a list of cells (a name, config overrides, labels) run for several seeds; a
training cell is evaluated at several steps. `run_experiment` appends one row per (cell, seed,
evaluation point) to `results/mini/<experiment>.csv` with provenance (config hash, git sha, date,
seed) and skips rows already there, so an interrupted grid resumes where it stopped (training
also resumes from the run's last checkpoint under `runs/mini/`). Workers are separate processes
with one torch thread each; only the parent writes the CSV.

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
import multiprocessing as mp
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from tg.config import Config, ConfigError, load_config
from tg.store.files import append_csv_rows, checked_rows, drop_torn_row, exclusive_run, provenance

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


STEPS_KEY = "_steps"
"""A training row carries its run's per-step metrics (tg.trainer.METRICS) since the previous evaluation point
under this key; the parent writes them to `steps_path` (what `tg mini rerun` compares step by step)."""


GRID_THREADS = 1
"""Torch threads a grid run trains with (two workers share two cores). The thread count changes float sums, so
`tg mini rerun` trains with the same count: a row reruns exactly only with the threads that made it."""


def mini_dir(root: str | Path | None = None) -> Path:
    """results/mini/ under `root` (default: this checkout)."""
    from tg.agent.world import resolve
    return (Path(root) if root else resolve(".")) / "results" / "mini"


def steps_path(path: Path) -> Path:
    """The per-step metrics beside a grid's CSV: results/mini/steps/<grid>.csv."""
    return path.parent / "steps" / path.name


GRID_KEY = ("cell", "seed", "step")
"""What names a row of a grid's CSV (and of its steps/ and questions/ files): each key is there once."""


def _row_key(row: dict) -> tuple[str, int, int]:
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
    return {_row_key(r) for r in grid_rows(path)}


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


def _provenance(cfg: Config, cell: Cell, seed: int, step: int) -> dict:
    """Which row this is and what made it; `machine` (CPU and torch's vector ISA) because floats depend on it."""
    from tg.agent.warmup import machine
    t = cfg.tree
    return {"cell": cell.name, "seed": seed, "step": step, "regime": regime_of(cell), "setting": cfg.data.setting,
            **cell.labels, "M": t.M, "N": t.N, "L": t.L, "budget": t.chain_equivalent_budget,
            "advantage": "chain" if t.is_chain else cfg.optim.advantage, **provenance(cfg, seed),
            "machine": machine()}


def _eval_columns(result: Any) -> dict:
    from tg.agent.data import is_single_hop
    single = [i for i, s in enumerate(result.sources) if is_single_hop(s)]
    multi = [i for i, s in enumerate(result.sources) if not is_single_hop(s)]
    sc, calls = np.array(result.scores), np.array(result.tool_calls, dtype=float)
    return {"em_single": round(100 * sc[single].mean(), 2), "em_multi": round(100 * sc[multi].mean(), 2),
            "calls_single": round(calls[single].mean(), 3), "calls_multi": round(calls[multi].mean(), 3),
            "n_single": len(single), "n_multi": len(multi)}


QUESTIONS_KEY = "_questions"
"""An evaluated row carries its per-question outcomes under this key; the parent writes them to `questions_path`."""


def questions_path(path: Path) -> Path:
    """The per-question outcomes beside a grid's CSV: results/mini/questions/<grid>.csv."""
    return path.parent / "questions" / path.name


def question_outcomes(result: Any, questions: list[Any]) -> dict:
    """One evaluation's test questions, compact: `correct` (one 0/1 character per question) and `searches` (one
    digit per question), single-hop questions first, in test-set order; `ids` a hash of that order."""
    import hashlib

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


def _training_columns(metrics: list[dict]) -> dict:
    """Training-side means up to this point: reward (last 10 steps), the budget ledger per question, seconds
    (`train_s`: the step timers summed up to this point)."""
    from tg.trainer import TIMERS
    if not metrics:
        return {}
    last = metrics[-10:]
    return {"train_reward": round(float(np.mean([m["reward"] for m in last])), 4),
            **{f"{k}_per_q": round(float(np.mean([m[k] for m in metrics])), 2)
               for k in ("trajectories", "generated", "tool_calls")},
            "train_s": round(sum(sum(m[k] for k in TIMERS) for m in metrics), 1)}


EARLIER_KEY = "_earlier_s"
"""A training row carries, under this key, the step seconds of the steps an interrupted earlier attempt of its run
trained before the checkpoint this attempt resumed from (they count in `run_s`; the row drops the key)."""


def run_job(job: Job, root: Path) -> Iterator[dict]:
    """Do one (cell, seed): yields one row per missing evaluation point as soon as it exists, with the seconds the
    worker spent making it (`run_s`: loading, training steps, checkpoint writes, evaluation; the steps of a run
    resumed after an interruption count once, by their timers)."""
    t0 = time.perf_counter()
    for row in _job_rows(job, root):
        earlier = row.pop(EARLIER_KEY, 0.0)
        yield {**row, "run_s": round(time.perf_counter() - t0 + earlier, 1)}
        t0 = time.perf_counter()


def _job_rows(job: Job, root: Path) -> Iterator[dict]:
    cfg = cell_config(job.cell, job.seed)
    kind = job.cell.kind
    if kind == "theory":
        yield {"cell": job.cell.name, "seed": job.seed, "step": 0, **theory_columns(job.seed),
               **provenance(None, job.seed)}
    elif kind == "ledger":
        yield {**_provenance(cfg, job.cell, job.seed, 0), **ledger_columns(cfg)}
    elif kind == "start":
        from tg.agent.policy import load_policy
        from tg.pipeline import evaluate_model, load_resources
        res = load_resources(cfg)
        model, tok = load_policy(res.policy_path)
        t0 = time.perf_counter()
        result = evaluate_model(model, tok, res, cfg, progress=False)
        yield {**_provenance(cfg, job.cell, job.seed, 0), **_eval_columns(result),
               "eval_s": round(time.perf_counter() - t0, 1), QUESTIONS_KEY: _questions(result, res, cfg)}
    else:
        from tg.pipeline import build_run, train_and_evaluate
        from tg.store.rundir import has_checkpoint, read_checkpoint
        from tg.trainer import TIMERS
        run = build_run(cfg, root / "runs" / "mini" / job.experiment / f"{job.cell.name}-s{job.seed}".replace("/", "_"))
        resumed_at = read_checkpoint(run.trainer.run_dir, mmap=True).state["step"] if has_checkpoint(run.trainer.run_dir) else 0
        machines = _run_machines(run.trainer.run_dir, resumed_at > 0)
        for p, metrics, result in train_and_evaluate(run, cfg, job.points, resumed_at > 0, progress=False):
            prev = max((q for q in job.cell.points if q < p), default=0)
            steps = [{"cell": job.cell.name, "seed": job.seed, **m} for m in metrics if prev < m["step"] <= p]
            earlier = sum(m[k] for m in steps if m["step"] <= resumed_at for k in TIMERS)
            yield {**_provenance(cfg, job.cell, job.seed, p), "machine": machines, **_eval_columns(result),
                   **_training_columns(metrics), STEPS_KEY: steps, EARLIER_KEY: earlier,
                   QUESTIONS_KEY: _questions(result, run.resources, cfg)}


def _questions(result: Any, res: Any, cfg: Config) -> dict:
    single, multi = res.test_sets(cfg)
    return question_outcomes(result, single + multi)


def _run_machines(run_dir: Path, resumed: bool) -> str:
    """The CPU kind(s) that trained a run: this one, or 'A → B' when it resumes a checkpoint made on another kind
    (run_dir/machine.txt keeps the first); floats depend on it, so a pair's report flags a mixed run."""
    from tg.agent.warmup import machine
    mark, now = run_dir / "machine.txt", machine()
    first = mark.read_text().strip() if resumed and mark.exists() else ""
    if not first:
        mark.write_text(now + "\n")
        return now
    return now if first == now else f"{first} → {now}"


def ledger_columns(cfg: Config, n_questions: int = 16) -> dict:
    """Claim 1: one batch of rollouts (the trainer's sampling at step 0) from the starting policy on the
    first `n_questions` training questions of the setting; the budget ledger per question and per trajectory."""
    from tg.agent.policy import load_policy
    from tg.budget import Ledger, ledgers
    from tg.engines.engine import HFEngine
    from tg.pipeline import load_resources
    from tg.trainer import rollout_seed, sample_batch
    res = load_resources(cfg)
    model, tok = load_policy(res.policy_path)
    questions = res.train_set(cfg)[:n_questions]
    trees, stats = sample_batch(HFEngine(model, tok, prefix_reuse=cfg.tree.prefix_reuse), res.env(tok, cfg),
                                questions, cfg, rollout_seed(cfg.optim.seed, 0))
    total = Ledger.total(ledgers(trees, stats))
    return {**{f"{k}_per_q": round(v, 2) for k, v in total.per(len(questions)).items()},
            "generated_per_traj": round(total.generated / total.trajectories, 2),
            "calls_per_traj": round(total.tool_calls / total.trajectories, 3), "n_questions": len(questions)}


def theory_columns(seed: int) -> dict:
    """Claim 7: Proposition 3.1 on a random toy tree and policy; the largest deviations from the closed forms."""
    import torch

    from tg.theory import init_theta, proposition_3_1, toy_tree
    tree = toy_tree(seed=seed)
    r = proposition_3_1(init_theta(tree, seed=seed), tree)
    g = r["grad_log_ratio"]
    return {"p_win": round(float(r["p_win"]), 6),
            "intra_err": float((r["grad_intra"] - r["weight_intra"] * g).abs().max()),
            "dpo_err": float((r["grad_dpo"] - r["weight_dpo"] * g).abs().max()),
            "ratio_err": float((r["grad_intra"] - r["p_win"] * r["grad_dpo"]).abs().max()),
            "grad_scale": float(torch.linalg.vector_norm(g))}


def _job_weight(job: Job) -> int:
    """Progress units: training steps still to run (at least 1 per job)."""
    return max(job.points) if job.cell.kind == "train" else 1


def _worker(jobs: Any, out: Any, root: str) -> None:
    from tg.agent.warmup import torch_threads
    with torch_threads(GRID_THREADS):
        while (job := jobs.get()) is not None:
            try:
                for row in run_job(job, Path(root)):
                    out.put(("row", job, row))
            except Exception as err:  # reported by the parent; the other jobs go on
                out.put(("error", job, f"{type(err).__name__}: {err}"))
            out.put(("done", job, None))


def run_lock(root: Path, name: str) -> Path:
    """The lock file a run of grid `name` under `root` holds: runs/mini/<name>.lock, beside the runs' checkpoints,
    which two runs of one grid would write at once too."""
    return root / "runs" / "mini" / f"{name}.lock"


def check_workers(workers: int) -> None:
    """ConfigError unless `workers` is a usable process count (at least 1)."""
    if workers < 1:
        raise ConfigError(f"--workers {workers}: a grid runs with at least 1 worker process (default 2)")


def run_experiment(name: str, workers: int = 2, root: str | Path | None = None,
                   cells: list[Cell] | None = None) -> Path:
    """Run every missing (cell, seed, point) of experiment `name`; rows go to <root>/results/mini/<name>.csv. One run
    of a grid under a root at a time: a second is refused at once (`run_lock`), so no row is made twice."""
    from tg.agent.world import resolve
    check_workers(workers)
    cells = select_cells(name) if cells is None else cells
    root = Path(root) if root else resolve(".")
    path = mini_dir(root) / f"{name}.csv"
    with exclusive_run(run_lock(root, name), f"`tg mini run {name}` on {mini_dir(root)}"):
        for p in (path, steps_path(path), questions_path(path)):  # a torn last row: dropped (one warning), made again
            drop_torn_row(p, GRID_KEY, ints=("seed", "step"))
        if name == "confirm":  # the declared rule picks the stage (tg.experiments.confirm, results/mini/confirm.md)
            from tg.experiments import confirm
            rows = read_grid(path) if path.exists() else None
            cells = confirm.active_cells(cells, rows)
            print(f"experiment confirm: {confirm.primary_verdict(rows) if rows is not None else 'stage 1 running'}; "
                  f"stages run now: {', '.join(sorted({c.labels['stage'] for c in cells}))}", flush=True)
        reused = reuse_rows(cells, path)
        if reused:
            print(f"experiment {name}: {len(reused)} rows copied from identical configurations already run "
                  f"({', '.join(sorted({r['reused_from'] for r in reused}))})", flush=True)
        jobs = pending_jobs(name, cells, path)
        print(f"experiment {name}: {len(cells)} cells, {len(jobs)} (cell, seed) jobs to run "
              f"({sum(len(j.points) for j in jobs)} rows) -> {path}", flush=True)
        if jobs:
            _run_jobs(name, jobs, cells, root, path, workers)
    return path


def _run_jobs(name: str, jobs: list[Job], cells: list[Cell], root: Path, path: Path, workers: int) -> None:
    """Do `jobs` in `workers` processes (inline with one), writing each row to `path` as it arrives."""
    from tqdm.auto import tqdm

    from tg.pipeline import load_resources
    for overrides in dict.fromkeys(c.overrides for c in cells if c.kind != "theory"):
        load_resources(cell_config(Cell("", "start", overrides), 0))  # world and pinned starts, once, before the workers
    t0, errors = time.perf_counter(), []
    bar = tqdm(total=sum(_job_weight(j) for j in jobs), desc=name, unit="step")
    if workers <= 1:
        _collect(_inline(jobs, root), path, bar, errors)
    else:
        ctx = mp.get_context("spawn")
        q_jobs, q_out = ctx.Queue(), ctx.Queue()
        for j in jobs:
            q_jobs.put(j)
        procs = [ctx.Process(target=_worker, args=(q_jobs, q_out, str(root)), daemon=True) for _ in range(workers)]
        for p in procs:
            q_jobs.put(None)
            p.start()
        signal.signal(signal.SIGTERM, _exit_on_sigterm)  # `kill` stops the workers too (via finally)
        try:
            _collect((q_out.get() for _ in iter(int, 1)), path, bar, errors, n_jobs=len(jobs))
        finally:
            for p in procs:
                p.terminate() if p.is_alive() else None
    bar.close()
    print(f"experiment {name}: {time.perf_counter() - t0:.0f} s wall with {workers} worker(s); "
          f"{len(errors)} failed job(s)", flush=True)
    for e in errors:
        print("  FAILED", e)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}; rerun the same command to resume")


def _inline(jobs: list[Job], root: Path) -> Iterator[tuple[str, Job, Any]]:
    from tg.agent.warmup import torch_threads
    with torch_threads(GRID_THREADS):
        for job in jobs:
            for row in run_job(job, root):
                yield "row", job, row
            yield "done", job, None


def _collect(events: Any, path: Path, bar: Any, errors: list[str], n_jobs: int | None = None) -> None:
    """Write each row as it arrives; advance the bar by the training steps each row and job end stand for."""
    finished, progressed = 0, {}
    for kind, job, payload in events:
        if kind == "row":
            steps = payload.pop(STEPS_KEY, [])
            done = done_keys(steps_path(path))
            if new := [r for r in steps if _row_key(r) not in done]:  # steps first: a row means its steps are in
                append_grid_rows(steps_path(path), new)
            if outcomes := payload.pop(QUESTIONS_KEY, None):
                key = {k: payload[k] for k in ("cell", "seed", "step")}
                if _row_key(key) not in done_keys(questions_path(path)):
                    append_grid_rows(questions_path(path), [{**key, **outcomes}])
            append_grid_rows(path, [payload])
            step = int(payload["step"]) if job.cell.kind == "train" else 0
            bar.update(max(step - progressed.get(job, 0), 0))
            progressed[job] = max(step, progressed.get(job, 0))
        elif kind == "error":
            errors.append(f"{job.cell.name} seed {job.seed}: {payload}")
        else:
            bar.update(max(_job_weight(job) - progressed.pop(job, 0), 0))
            finished += 1
            if n_jobs is not None and finished == n_jobs:
                return
