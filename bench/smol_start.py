"""Can the smol preset's model act? Protocol-following of SmolLM2-135M-Instruct zero-shot and after its warm-up.

For the converted base model (`warmup.enabled=false`) and the pinned warmed-up start, one greedy chain per test
question (the first `--questions` single-hop and as many multi-hop ones, the paper's prompt through the chat
template): the share of well-formed trajectories (Eq. 13's format check), of trajectories that search at least
once, and EM, per kind of question.

    .venv/bin/python bench/smol_start.py [--questions 25] [--threads 2] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _blocks import publish

from tg.agent.policy import load_policy
from tg.agent.tasks import make_reward
from tg.batch import leaf_rewards
from tg.config import load_config
from tg.engines.engine import HFEngine
from tg.pipeline import load_resources
from tg.trainer import sample_batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=25, help="test questions of each kind")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", default=None, help="replace the smol_start section of this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines = [f"`bench/smol_start.py --questions {args.questions}`: one greedy chain per test question, "
             f"{args.questions} single-hop and {args.questions} multi-hop.", "",
             "| policy | questions | well-formed | searched | EM | seconds |", "|---" * 6 + "|"]
    for name, overrides in (("SmolLM2-135M-Instruct, zero-shot", ("warmup.enabled=false",)), ("smol start", ())):
        cfg = load_config("smol", "agent.temperature=0", "tree.M=1", "tree.N=0", "tree.L=0", *overrides)
        res = load_resources(cfg)
        model, tok = load_policy(res.policy_path)
        single, multi = res.test_sets(cfg)
        for kind, questions in (("single-hop", single[:args.questions]), ("multi-hop", multi[:args.questions])):
            t0 = time.perf_counter()
            trees, _ = sample_batch(HFEngine(model, tok), res.env(tok, cfg), questions, cfg, seed=0)
            flat = [t for ts in trees for t in ts]
            sc = leaf_rewards(flat, [q.golden_answers for q in questions], make_reward(cfg))
            lines.append(f"| {name} | {len(questions)} {kind} | {np.mean(sc['valid']):.0%} | "
                         f"{np.mean([c > 0 for c in sc['calls']]):.0%} | {np.mean(sc['em']):.2f} | "
                         f"{time.perf_counter() - t0:.0f} |")
            print(lines[-1], flush=True)
    publish(lines, args.write, "smol_start")


if __name__ == "__main__":
    main()
