"""Running a grid: every missing (cell, seed, evaluation point) of an experiment, in worker processes.

`run_experiment` appends each row to `results/mini/<experiment>.csv` as it arrives and skips rows already there, so
an interrupted grid resumes where it stopped (training also resumes from the run's last checkpoint under
`runs/mini/`). Workers are separate processes with one torch thread each; only the parent writes the files, and a worker ends
when its parent does (`watch_parent`), even killed, so no orphan trains rows nobody writes."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from tg.config import ConfigError
from tg.experiments.measure import QUESTIONS_KEY, STEPS_KEY, run_job
from tg.experiments import confirm
from tg.experiments.cells import Cell, cell_config
from tg.experiments.mini import select_cells
from tg.experiments.grid_files import (GRID_KEY, Job, append_grid_rows, done_keys, mini_dir, pending_jobs, questions_path,
                                       read_grid, reuse_rows, row_key, run_lock, steps_path)
from tg.store.files import drop_torn_row, exclusive_run


GRID_THREADS = 1
"""Torch threads a grid run trains with (two workers share two cores). The thread count changes float sums, so
`tg mini rerun` trains with the same count: a row reruns exactly only with the threads that made it."""


def _job_span(job: Job) -> tuple[int, int]:
    """Progress units (training steps) a job starts and ends at: from the cell's evaluation point before the job's
    first (its run resumes there) to its last point; (0, 1) for a job that trains nothing."""
    if job.cell.kind != "train":
        return 0, 1
    return max((p for p in job.cell.points if p < min(job.points)), default=0), max(job.points)


def watch_parent(parent: int, every_s: float = 1.0) -> None:
    """End this process (exit 1) within `every_s` seconds of its parent's death, from a daemon thread: a worker
    whose `tg mini run` was killed (SIGKILL runs no handler) stops instead of training on as an orphan whose rows
    nobody writes."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)
    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def _worker(jobs: Any, out: Any, root: str, parent: int) -> None:
    from tg.agent.warmup import torch_threads
    watch_parent(parent)
    with torch_threads(GRID_THREADS):
        while (job := jobs.get()) is not None:
            try:
                for row in run_job(job, Path(root)):
                    out.put(("row", job, row))
            except Exception as err:  # reported by the parent; the other jobs go on
                out.put(("error", job, f"{type(err).__name__}: {err}"))
            out.put(("done", job, None))


class JobsFailed(RuntimeError):
    """Jobs of a grid failed in their worker processes (the other jobs went on): the grid's rows are incomplete, and
    `tg mini run` exits 1 so that a script does not go on to report on them."""


def check_workers(workers: int) -> None:
    """ConfigError unless `workers` is a usable process count (at least 1)."""
    if workers < 1:
        raise ConfigError(f"--workers {workers}: a grid runs with at least 1 worker process (default 2)")


def check_until(until: int | None) -> None:
    """ConfigError unless `until` is None or a training step (at least 1)."""
    if until is not None and until < 1:
        raise ConfigError(f"--until {until}: name the last evaluation step to run now (at least 1), or leave it out")


def run_experiment(name: str, workers: int = 2, root: str | Path | None = None,
                   cells: list[Cell] | None = None, until: int | None = None) -> Path:
    """Run every missing (cell, seed, point) of experiment `name`; rows go to <root>/results/mini/<name>.csv. One run
    of a grid under a root at a time: a second is refused at once (`run_lock`), so no row is made twice. With
    `until`, only the points up to that step: a run stops at its checkpoint there, and a later call resumes it
    from that checkpoint (the same state, so its later rows equal those of an uninterrupted run). Raises JobsFailed,
    once every job has ended, when any failed."""
    from tg.agent.world import resolve
    check_workers(workers)
    check_until(until)
    cells = select_cells(name) if cells is None else cells
    if until is not None:
        cells = [c for c in (replace(c, points=tuple(p for p in c.points if p <= until)) for c in cells) if c.points]
    root = Path(root) if root else resolve(".")
    path = mini_dir(root) / f"{name}.csv"
    failed = 0
    with exclusive_run(run_lock(root, name), f"`tg mini run {name}` on {mini_dir(root)}"):
        for p in (path, steps_path(path), questions_path(path)):  # a torn last row: dropped (one warning), made again
            drop_torn_row(p, GRID_KEY, ints=("seed", "step"))
        while True:  # one pass; the confirmatory grid goes on while its rule adds cells after a look
            now = _stage_cells(name, cells, path)
            reused = reuse_rows(now, path)
            if reused:
                print(f"experiment {name}: {len(reused)} rows copied from identical configurations already run "
                      f"({', '.join(sorted({r['reused_from'] for r in reused}))})", flush=True)
            jobs = pending_jobs(name, now, path)
            print(f"experiment {name}: {len(now)} cells, {len(jobs)} (cell, seed) jobs to run "
                  f"({sum(len(j.points) for j in jobs)} rows) -> {path}", flush=True)
            failed = _run_jobs(name, jobs, now, root, path, workers) if jobs else 0
            if not jobs or failed or name != "confirm":
                break
    if failed:
        raise JobsFailed(f"experiment {name}: {failed} job(s) failed (each printed after FAILED above), so their rows "
                         f"are missing from {path}: fix the cause and rerun the same command to make them")
    return path


def _stage_cells(name: str, cells: list[Cell], path: Path) -> list[Cell]:
    """The cells to run now: all of them, but for the confirmatory grid those its declared rule runs at this point
    (`tg.experiments.confirm.active_cells`, results/mini/confirm.md)."""
    if name != "confirm":
        return cells
    rows = read_grid(path) if path.exists() else None
    now = confirm.active_cells(cells, rows)
    print(f"experiment confirm: {confirm.primary_verdict(rows) if rows is not None else 'stage 1 running'}; "
          f"stages run now: {', '.join(sorted({c.labels['stage'] for c in now}))}", flush=True)
    return now


def _run_jobs(name: str, jobs: list[Job], cells: list[Cell], root: Path, path: Path, workers: int) -> int:
    """Do `jobs` in `workers` processes (inline with one), writing each row to `path` as it arrives; returns the
    number of failed jobs."""
    from tg.progress import tqdm

    from tg.pipeline import load_resources
    for overrides in dict.fromkeys(c.overrides for c in cells if c.kind != "theory"):
        load_resources(cell_config(Cell("", "start", overrides), 0))  # world and pinned starts, once, before the workers
    t0, errors = time.perf_counter(), []
    bar = tqdm(total=sum(end - begin for begin, end in map(_job_span, jobs)), desc=name, unit="step")
    if workers <= 1:
        _collect(_inline(jobs, root), path, bar, errors)
    else:
        ctx = mp.get_context("spawn")
        q_jobs, q_out = ctx.Queue(), ctx.Queue()
        for j in jobs:
            q_jobs.put(j)
        procs = [ctx.Process(target=_worker, args=(q_jobs, q_out, str(root), os.getpid()), daemon=True)
                 for _ in range(workers)]
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
    return len(errors)


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
            if new := [r for r in steps if row_key(r) not in done]:  # steps first: a row means its steps are in
                append_grid_rows(steps_path(path), new)
            if outcomes := payload.pop(QUESTIONS_KEY, None):
                key = {k: payload[k] for k in ("cell", "seed", "step")}
                if row_key(key) not in done_keys(questions_path(path)):
                    append_grid_rows(questions_path(path), [{**key, **outcomes}])
            append_grid_rows(path, [payload])
            step, at = int(payload["step"]) if job.cell.kind == "train" else 0, progressed.get(job, _job_span(job)[0])
            bar.update(max(step - at, 0))
            progressed[job] = max(step, at)
        elif kind == "error":
            errors.append(f"{job.cell.name} seed {job.seed}: {payload}")
        else:
            bar.update(max(_job_span(job)[1] - progressed.pop(job, _job_span(job)[0]), 0))
            finished += 1
            if n_jobs is not None and finished == n_jobs:
                return
