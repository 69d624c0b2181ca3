"""What one (cell, seed) job of a grid measures: its rows, one per evaluation point, with provenance (config
hash, git sha, date, seed, CPU kind), the evaluation's EMs, the training's means and timers, and what the parent
writes beside them (per-step metrics, per-question outcomes)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from tg.config import Config
from tg.experiments.cells import Cell, cell_config, regime_of
from tg.experiments.grid_files import Job, question_outcomes
from tg.metrics import TIMERS
from tg.store.files import provenance


STEPS_KEY = "_steps"
"""A training row carries its run's per-step metrics (tg.metrics.METRICS) since the previous evaluation point
under this key; the parent writes them to `steps_path` (what `tg mini rerun` compares step by step)."""


QUESTIONS_KEY = "_questions"
"""An evaluated row carries its per-question outcomes under this key; the parent writes them to `questions_path`."""


def _provenance(cfg: Config, cell: Cell, seed: int, step: int) -> dict:
    """Which row this is and what made it; `machine` (CPU and torch's vector ISA) because floats depend on it."""
    from tg.agent.warmup import machine
    t = cfg.tree
    return {"cell": cell.name, "seed": seed, "step": step, "regime": regime_of(cell), "setting": cfg.data.setting,
            **cell.labels, "M": t.M, "N": t.N, "L": t.L, "budget": t.chain_equivalent_budget,
            "advantage": "chain" if t.is_chain else cfg.optim.advantage, **provenance(cfg, seed),
            "machine": machine()}


def eval_columns(result: Any) -> dict:
    from tg.agent.data import is_single_hop
    single = [i for i, s in enumerate(result.sources) if is_single_hop(s)]
    multi = [i for i, s in enumerate(result.sources) if not is_single_hop(s)]
    sc, calls = np.array(result.scores), np.array(result.tool_calls, dtype=float)
    return {"em_single": round(100 * sc[single].mean(), 2), "em_multi": round(100 * sc[multi].mean(), 2),
            "calls_single": round(calls[single].mean(), 3), "calls_multi": round(calls[multi].mean(), 3),
            "n_single": len(single), "n_multi": len(multi)}


def _training_columns(metrics: list[dict]) -> dict:
    """Training-side means up to this point: reward (last 10 steps), the budget ledger per question, seconds
    (`train_s`: the step timers summed up to this point)."""
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
        yield {**_provenance(cfg, job.cell, job.seed, 0), **eval_columns(result),
               "eval_s": round(time.perf_counter() - t0, 1), QUESTIONS_KEY: _questions(result, res, cfg)}
    else:
        from tg.pipeline import build_run, train_and_evaluate
        from tg.store.rundir import RunDirError, check_trained_as, has_checkpoint, read_checkpoint
        run_dir = root / "runs" / "mini" / job.experiment / f"{job.cell.name}-s{job.seed}".replace("/", "_")
        resumed_at = 0
        if has_checkpoint(run_dir):  # a run an earlier grid run began: resumed only under the config it trained with
            check_trained_as(run_dir, cfg, f"cell {job.cell.name!r} has changed since; move {run_dir} away to train "
                                           "it anew under the new config")
            resumed_at = read_checkpoint(run_dir, mmap=True).state["step"]
        run = build_run(cfg, run_dir)
        machines = _run_machines(run.trainer.run_dir, resumed_at > 0)
        passed = [p for p in job.points if p < resumed_at]
        for p, metrics, result in train_and_evaluate(run, cfg, [p for p in job.points if p >= resumed_at],
                                                     resumed_at > 0, progress=False):
            prev = max((q for q in job.cell.points if q < p), default=0)
            steps = [{"cell": job.cell.name, "seed": job.seed, **m} for m in metrics if prev < m["step"] <= p]
            earlier = sum(m[k] for m in steps if m["step"] <= resumed_at for k in TIMERS)
            yield {**_provenance(cfg, job.cell, job.seed, p), "machine": machines, **eval_columns(result),
                   **_training_columns(metrics), STEPS_KEY: steps, EARLIER_KEY: earlier,
                   QUESTIONS_KEY: _questions(result, run.resources, cfg)}
        if passed:  # the later points were evaluated from the checkpoint; these need the run again from its start
            raise RunDirError(f"{run_dir} holds a checkpoint at step {resumed_at}, past the evaluation point(s) "
                              f"{', '.join(map(str, passed))} whose rows are missing (its run went on after its last "
                              f"row was written): the later points are evaluated; move {run_dir} away and rerun the "
                              "same command to train the run again for them")


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
