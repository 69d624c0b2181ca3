"""`make demo`: chain GRPO (group 4) vs Tree-GRPO (M=2, N=2, L=1), the paper's equal-budget pair,
trained from the same warmed-up policy with the same seed, evaluated on the same test sets.

Prints one greedy transcript of the starting policy, then a comparison table, and writes the figure, the rows
and both runs under a root directory (`outputs`): by default runs/demo/, which git ignores, so a checkout stays
clean. The committed reference rows (results/demo.csv, whose newest run the README's demo table shows through
`tg mini report --readme`) and figures/demo_chain_vs_tree.png change only when asked: `tg demo --root .`.
Whatever it shows is reported as is.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tg.agent.data import is_single_hop
from tg.agent.policy import load_policy
from tg.agent.tasks import make_reward
from tg.agent.world import resolve
from tg.batch import leaf_rewards
from tg.config import Config
from tg.engines.engine import HFEngine
from tg.evaluate import EvalResult, result_row
from tg.pipeline import Resources, build_run, evaluate_model, load_resources, method_name
from tg.store.files import append_csv_rows
from tg.trainer import sample_batch

PAIR = {"chain GRPO, G=4": dict(M=4, N=0, L=0), "Tree-GRPO (2,2,1)": dict(M=2, N=2, L=1)}


class Outputs(NamedTuple):
    """Where a demo under one root writes: its rows, its figure, and the directory of its two runs."""

    rows: Path
    figure: Path
    runs: Path


def outputs(root: str | Path | None = None, preset: str = "cpu") -> Outputs:
    """The demo's files under `root`, laid out as in a checkout (results/, figures/, runs/); default runs/demo/.
    Another preset's demo writes files of its own (results/demo_smol.csv, figures/demo_smol_chain_vs_tree.png)."""
    base = Path(root) if root else resolve("runs") / "demo"
    tag = "" if preset == "cpu" else f"_{preset}"
    return Outputs(base / "results" / f"demo{tag}.csv", base / "figures" / f"demo{tag}_chain_vs_tree.png", base / "runs")


def _multi_hop_calls(result: EvalResult) -> float:
    calls = [c for c, s in zip(result.tool_calls, result.sources) if not is_single_hop(s)]
    return float(np.mean(calls)) if calls else float("nan")


def chain_batch(model: Any, tok: Any, res: Resources, cfg: Config, n_questions: int = 4, group: int = 4) -> str:
    """`group` sampled chains (training temperature) for the first `n_questions` multi-hop test questions,
    one line per chain: its searches, its answer and its reward (the GRPO baseline's rollout)."""
    questions = res.test_sets(cfg)[1][:n_questions]
    trees, _ = sample_batch(HFEngine(model, tok), res.env(tok, cfg), questions,
                            cfg.replace(tree=dict(M=group, N=0, L=0)), cfg.optim.seed)
    flat = [t for ts in trees for t in ts]
    leaf_rewards(flat, [q.golden_answers for q in questions], make_reward(cfg))
    lines = []
    for q, ts in zip(questions, trees):
        lines.append(f"Q: {q.question}   gold: {q.golden_answers[0]}")
        for t in ts:
            (leaf,) = t.leaves()
            steps = t.path(leaf)
            searches = " -> ".join(s.action.argument for s in steps if s.action.kind == "search") or "(none)"
            answer = next((s.action.argument for s in reversed(steps) if s.action.kind == "answer"), "(none)")
            lines.append(f"   searches: {searches:<34} answer: {answer:<12} reward: {t.rewards[leaf]:+.2f}")
    return "\n".join(lines)


def _table(rows: dict[str, dict]) -> str:
    head = f"{'method':<22}{'EM 1-hop':>9}{'EM multi':>9}{'calls/multi':>12}{'traj/q':>8}{'tokens/q':>9}{'min':>6}"
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        lines.append(f"{name:<22}{r['em_single']:>9.3f}{r['em_multi']:>9.3f}{r['calls_multi']:>12.2f}"
                     f"{r['trajectories']:>8.1f}{r['generated']:>9.0f}{r['minutes']:>6.1f}")
    return "\n".join(lines)


def _summary(result: EvalResult, metrics: list[dict], seconds: float) -> dict:
    by = result.by_source()
    single = np.mean([v for k, v in by.items() if is_single_hop(k)])
    multi = np.mean([v for k, v in by.items() if not is_single_hop(k)])
    return {"em_single": float(single), "em_multi": float(multi), "calls_multi": _multi_hop_calls(result),
            "trajectories": float(np.mean([m["trajectories"] for m in metrics])) if metrics else 0.0,
            "generated": float(np.mean([m["generated"] for m in metrics])) if metrics else 0.0,
            "minutes": seconds / 60}


def _train(name: str, run_cfg: Config, run_dir: Path, threads: int) -> tuple[str, list[dict], EvalResult, float]:
    """Train one method of the pair from the pinned start and evaluate it (a worker process's job)."""
    import torch
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    run = build_run(run_cfg, run_dir)
    history = run.trainer.fit(progress=False)
    result = evaluate_model(run.trainer.policy.model, run.tokenizer, run.resources, run_cfg, progress=False)
    return name, history, result, time.perf_counter() - t0


def _train_pair(cfg: Config, jobs: list[tuple[str, Config, Path]]) -> dict[str, tuple]:
    """Both runs at once, one process and one torch thread each, where there are two cores (a run's floats,
    hence its numbers, are those of a one-thread `tg mini` run); else one after the other. One progress bar
    counts both runs' steps from their metrics files."""
    import concurrent.futures as cf
    import multiprocessing as mp
    import os

    import torch
    from tg.progress import tqdm
    workers = 2 if (os.cpu_count() or 1) >= 2 else 1
    out: dict[str, tuple] = {}
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool, \
            tqdm(total=len(jobs) * cfg.optim.steps, desc="train (both methods)", unit="step") as bar:
        threads = 1 if workers > 1 else torch.get_num_threads()
        futures = [pool.submit(_train, name, c, d, threads) for name, c, d in jobs]
        while not all(f.done() for f in futures):
            cf.wait(futures, timeout=2)
            bar.n = sum(len((d / "metrics.jsonl").read_text().splitlines()) if (d / "metrics.jsonl").exists() else 0
                        for _, _, d in jobs)
            bar.refresh()
        for f in futures:
            name, history, result, seconds = f.result()
            out[name] = (history, result, seconds)
    return out


def run_demo(cfg: Config, root: str | Path | None = None) -> dict[str, dict]:
    """Train both methods for cfg.optim.steps steps and compare them; returns the table rows. Runs, rows and the
    figure go under `root` (`outputs`; default runs/demo/): runs/, results/demo.csv, figures/demo_chain_vs_tree.png."""
    out = outputs(root, cfg.preset)
    summaries = {}
    res = load_resources(cfg)
    model, tok = load_policy(res.policy_path)
    start = evaluate_model(model, tok, res, cfg, progress=False)
    n_single = len(res.test_sets(cfg)[0])
    print("\nA greedy multi-hop episode of the warmed-up policy (before RL):\n" + start.transcripts[n_single])
    print("\nA batch of sampled chains (G=4, temperature {}) with their rewards:\n".format(cfg.agent.temperature)
          + chain_batch(model, tok, res, cfg))
    summaries["start (warmed up)"] = _summary(start, [], 0.0)
    rows = [{**result_row(start, cfg, method="start", model=cfg.model.name_or_path, seed=cfg.optim.seed, step=0),
             **_row_extras(summaries["start (warmed up)"])}]
    jobs = []
    for name, shape in PAIR.items():
        run_cfg = cfg.replace(tree=shape)
        run_dir = out.runs / f"demo-{run_cfg.hash()}"
        if run_dir.exists():  # a finished or interrupted earlier demo: train afresh
            import shutil
            shutil.rmtree(run_dir)
        jobs.append((name, run_cfg, run_dir))
    t0 = time.perf_counter()
    trained = _train_pair(cfg, jobs)
    histories = {name: trained[name][0] for name, _, _ in jobs}
    for name, run_cfg, _ in jobs:
        history, result, seconds = trained[name]
        summaries[name] = _summary(result, history, seconds)
        rows.append({**result_row(result, run_cfg, method=method_name(run_cfg), model=cfg.model.name_or_path,
                                  seed=cfg.optim.seed, step=run_cfg.optim.steps), **_row_extras(summaries[name])})
    for row in rows:   # the code that ran is the commit the demo started at, whatever was committed meanwhile
        row["git_sha"] = rows[0]["git_sha"]
    append_csv_rows(out.rows, rows)
    print("\n" + _table(summaries))
    print(f"\ntraining and evaluating both: {(time.perf_counter() - t0) / 60:.1f} minutes")
    path = draw_demo(histories, summaries, out.figure, cfg)
    print(f"\nrows: {out.rows}\nfigure: {path}\n" + json.dumps(summaries, indent=1))
    return summaries


def _row_extras(summary: dict) -> dict:
    return {"trajectories_per_q": round(summary["trajectories"], 2), "generated_per_q": round(summary["generated"], 1),
            "minutes": round(summary["minutes"], 2)}


def draw_demo(histories: dict[str, list[dict]], summaries: dict[str, dict], path: Path, cfg: Config) -> Path:
    """Learning curves (training reward, leaf EM) and test EM bars, side by side."""
    import matplotlib.pyplot as plt

    from tg.experiments.plots import learning_curves
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.6))
    learning_curves(histories, ("reward", "em"), ax=ax[:2])
    names = list(summaries)
    x = np.arange(len(names))
    ax[2].bar(x - 0.2, [summaries[n]["em_single"] for n in names], 0.4, label="single-hop")
    ax[2].bar(x + 0.2, [summaries[n]["em_multi"] for n in names], 0.4, label="multi-hop")
    ax[2].set_xticks(x, [n.replace(", ", "\n").replace(" (", "\n(") for n in names], fontsize=7)
    ax[2].set_ylabel("greedy test EM")
    ax[2].legend(fontsize=8)
    fig.suptitle(f"tg ({cfg.preset} preset, synthetic world): chain vs tree at equal budget, "
                 f"{cfg.optim.steps} steps, seed {cfg.optim.seed}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
