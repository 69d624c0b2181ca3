"""What the claims grid costs, piece by piece: a projection from a few timed steps of every kind of run it trains.

The grids `budget`, `shapes`, `ablation` and `sweep` (tg.experiments.mini) train one run per (cell, seed); a run whose
configuration another grid already trains is counted once (tg.experiments.grid_files.reuse_rows copies its rows). Runs are
grouped by what sets their cost (start, setting, tree shape); for each group one run from seed 0 is timed for
`--steps` steps after one untimed step, with the trainer's own timers (rollout, reference log-probs, update),
and once each: a checkpoint write, an evaluation (both test sets) and a worker's start-up (a new Python
process importing tg and building a run). The projection prices every run at `optim.steps` steps, one
evaluation per evaluation point and a checkpoint every `optim.checkpoint_every` steps, in CPU seconds of
one torch thread per worker (`tg mini run --workers 2` on 2 cores halves the wall time). Early steps are
shorter than late ones (a policy that learns to search reads more), so the projection is a lower bound on
a real rerun, whose own timers are in its rows (`train_s`, `eval_s`).

    .venv/bin/python bench/grid_cost.py [--steps 2] [--grids budget shapes ablation sweep] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from _blocks import step_medians, write_section

from tg.experiments.cells import cell_config, regime_of
from tg.experiments.mini import experiments
from tg.metrics import TIMERS
from tg.pipeline import build_run, evaluate_model

GRIDS = ("budget", "shapes", "ablation", "sweep")
STARTUP = ("import time; t = time.perf_counter(); import tempfile; from tg.pipeline import build_run; "
           "from tg.experiments.cells import cell_config; from tg.experiments.mini import experiments; "
           "c = [c for c in experiments()['budget'] if c.kind == 'train'][0]; build_run(cell_config(c, 0), tempfile.mkdtemp()); "
           "print(time.perf_counter() - t)")


def training_runs(grids: tuple[str, ...]) -> dict[tuple, list[tuple[str, int]]]:
    """(regime, setting, M, N, L) -> the distinct (cell, seed) runs of that kind, reused runs counted once."""
    seen: set[str] = set()
    groups: dict[tuple, list[tuple[str, int]]] = defaultdict(list)
    for name in grids:
        for cell in experiments()[name]:
            if cell.kind != "train":
                continue
            for seed in cell.seeds:
                cfg = cell_config(cell, seed)
                if cfg.hash() not in seen:
                    seen.add(cfg.hash())
                    t = cfg.tree
                    groups[regime_of(cell), cfg.data.setting, t.M, t.N, t.L].append((cell.name, seed))
    return groups


def time_group(cell_name: str, grids: tuple[str, ...], steps: int) -> dict[str, float]:
    """Median seconds per step of each part, one checkpoint write and one evaluation, for seed 0 of a cell."""
    cell = next(c for g in grids for c in experiments()[g] if c.name == cell_name)
    cfg = cell_config(cell, 0)
    run = build_run(cfg.replace(optim=dict(steps=steps + 1, checkpoint_every=0)), tempfile.mkdtemp(prefix="tg-cost-"))
    rows = run.trainer.fit(progress=False)[1:]
    out = step_medians(rows)
    t = time.perf_counter()
    run.trainer.save_checkpoint()
    out["checkpoint_s"] = time.perf_counter() - t
    t = time.perf_counter()
    evaluate_model(run.trainer.policy.model, run.tokenizer, run.resources, cfg, progress=False)
    out["eval_s"] = time.perf_counter() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2, help="timed steps per group (after one untimed step)")
    ap.add_argument("--grids", nargs="+", default=list(GRIDS), choices=GRIDS)
    ap.add_argument("--write", default=None, help="replace the grid_cost section of this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    grids = tuple(args.grids)
    startup = float(subprocess.run([sys.executable, "-c", STARTUP], capture_output=True, text=True,
                                   check=True).stdout.split()[-1])
    groups = training_runs(grids)
    some = next(c for g in grids for c in experiments()[g] if c.kind == "train")
    steps, every, points = (cell_config(some, 0).optim.steps, cell_config(some, 0).optim.checkpoint_every,
                                       len(some.points))
    lines = [f"`bench/grid_cost.py --steps {args.steps}`: worker start-up {startup:.1f} s; per run: {steps} steps, "
             f"{points} evaluations, {steps // every} checkpoints; {args.steps} timed steps per group, one torch thread.",
             "", "| start | setting | (M,N,L) | runs | rollout s | ref log-prob s | update s | step s | checkpoint s "
             "| eval s | run s | group h |", "|---" * 12 + "|"]
    print("\n".join(lines), flush=True)
    total = 0.0
    pieces = defaultdict(float)
    for key, runs in sorted(groups.items(), key=lambda kv: kv[0]):
        t = time_group(runs[0][0], grids, args.steps)
        step = sum(t[p] for p in TIMERS)
        run_s = steps * step + points * t["eval_s"] + steps // every * t["checkpoint_s"] + startup
        for p in TIMERS:
            pieces[p] += len(runs) * steps * t[p]
        pieces["eval_s"] += len(runs) * points * t["eval_s"]
        pieces["checkpoint_s"] += len(runs) * steps // every * t["checkpoint_s"]
        pieces["startup_s"] += len(runs) * startup
        total += len(runs) * run_s
        regime, setting, M, N, L = key
        lines.append(f"| {regime} | {setting} | ({M},{N},{L}) | {len(runs)} | {t['rollout_s']:.2f} | "
                     f"{t['logprob_s']:.2f} | {t['update_s']:.2f} | {step:.2f} | {t['checkpoint_s']:.2f} | "
                     f"{t['eval_s']:.1f} | {run_s:.0f} | {len(runs) * run_s / 3600:.2f} |")
        print(lines[-1], flush=True)
    lines += ["", f"{sum(len(r) for r in groups.values())} runs: {total / 3600:.1f} CPU hours of one thread, "
              f"{total / 7200:.1f} h on 2 cores with 2 workers; shares: "
              + ", ".join(f"{k[:-2]} {v / total:.0%}" for k, v in pieces.items()) + "."]
    print(lines[-1])
    if args.write:
        write_section(Path(args.write), "grid_cost", "\n".join(lines))


if __name__ == "__main__":
    main()
