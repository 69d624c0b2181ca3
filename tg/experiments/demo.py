"""`make demo`: chain GRPO (group 4) vs Tree-GRPO (M=2, N=2, L=1), the paper's equal-budget pair,
trained from the same warmed-up policy with the same seed, evaluated on the same test sets.

Prints one greedy transcript of the starting policy, then a comparison table, and writes
figures/demo_chain_vs_tree.png and rows to results/demo.csv. Whatever it shows is reported as is.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from tg.agent.data import is_single_hop
from tg.agent.policy import load_policy
from tg.agent.world import resolve
from tg.config import Config
from tg.engines.engine import HFEngine
from tg.evaluate import EvalResult, result_row
from tg.pipeline import Resources, build_run, evaluate_model, load_resources, method_name
from tg.store.files import append_csv_rows
from tg.trainer import leaf_rewards, sample_batch

PAIR = {"chain GRPO, G=4": dict(M=4, N=0, L=0), "Tree-GRPO (2,2,1)": dict(M=2, N=2, L=1)}


def _multi_hop_calls(result: EvalResult) -> float:
    calls = [c for c, s in zip(result.tool_calls, result.sources) if not is_single_hop(s)]
    return float(np.mean(calls)) if calls else float("nan")


def chain_batch(model: Any, tok: Any, res: Resources, cfg: Config, n_questions: int = 4, group: int = 4) -> str:
    """`group` sampled chains (training temperature) for the first `n_questions` multi-hop test questions,
    one line per chain: its searches, its answer and its reward (the GRPO baseline's rollout)."""
    questions = res.test_sets(cfg)[1][:n_questions]
    a = cfg.agent
    trees, _ = sample_batch(HFEngine(model, tok), res.env(tok, cfg), tok, questions,
                            cfg.replace(tree=dict(M=group, N=0, L=0)), cfg.optim.seed)
    flat = [t for ts in trees for t in ts]
    leaf_rewards(flat, [q.golden_answers for q in questions], a.reward, a.format_penalty)
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


def run_demo(cfg: Config, out_dir: str | Path = "figures") -> dict[str, dict]:
    """Train both methods for cfg.optim.steps steps and compare them; returns the table rows."""
    results, histories, summaries = {}, {}, {}
    res = load_resources(cfg)
    model, tok = load_policy(res.policy_path)
    start = evaluate_model(model, tok, res, cfg, progress=False)
    n_single = len(res.test_sets(cfg)[0])
    print("\nA greedy multi-hop episode of the warmed-up policy (before RL):\n" + start.transcripts[n_single])
    print("\nA batch of sampled chains (G=4, temperature {}) with their rewards:\n".format(cfg.agent.temperature)
          + chain_batch(model, tok, res, cfg))
    summaries["start (warmed up)"] = _summary(start, [], 0.0)
    for name, shape in PAIR.items():
        run_cfg = cfg.replace(tree=shape)
        t0 = time.perf_counter()
        run = build_run(run_cfg, resolve("runs") / f"demo-{run_cfg.hash()}")
        histories[name] = run.trainer.fit()
        results[name] = evaluate_model(run.trainer.policy.model, run.tokenizer, run.resources, run_cfg)
        summaries[name] = _summary(results[name], histories[name], time.perf_counter() - t0)
        row = result_row(results[name], run_cfg, method=method_name(run_cfg), model=cfg.model.name_or_path,
                         seed=cfg.optim.seed, step=run.trainer.step_done)
        append_csv_rows(resolve("results") / "demo.csv", [row])
    print("\n" + _table(summaries))
    path = draw_demo(histories, summaries, Path(resolve(out_dir)) / "demo_chain_vs_tree.png", cfg)
    print(f"\nfigure: {path}\n" + json.dumps(summaries, indent=1))
    return summaries


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
