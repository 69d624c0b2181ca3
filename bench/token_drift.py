"""Retokenization drift on a real BPE tokenizer: what the trainer trains on against what the policy sampled.

Samples the smol preset's training rollout (SmolLM2-135M start, (2,2,1) trees) for `--questions` training
questions, builds the training rows as a step does, and reports over every trajectory:
- tokens changed: positions where a training row's ids differ from the ids sampled and appended (goal 0);
- the largest |log-prob| difference between the trainer's recomputed log-probs (its own micro-batches and
  forward, trees packed as the preset packs them) and the engine's at sampling, over every policy token;
- what decoding and re-encoding would have done instead (the path the kit never takes): responses whose ids
  change, and sampled steps whose text contains a stop string inside their last token.

    .venv/bin/python bench/token_drift.py [--questions 50] [--threads 2] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from _blocks import publish

from tg.agent.protocol import STOP_STRINGS
from tg.batch import build_rows
from tg.config import load_config
from tg.pipeline import build_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", default=None, help="replace the token_drift section of this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config("smol").replace(optim=dict(prompts_per_step=args.questions, mini_batch_prompts=args.questions))
    tr = build_run(cfg, tempfile.mkdtemp(prefix="tg-drift-")).trainer
    tok = tr.tokenizer
    tr.engine.sync(tr.policy.model)  # as the trainer does before its first rollout
    trees, _ = tr.rollout(tr.batch_questions(0), 0)
    flat = [t for ts in trees for t in ts]
    trajs = [t.trajectory(leaf) for t in flat for leaf in t.leaves()]
    rows = build_rows(flat, torch.zeros(len(trajs)), tr.pad_id)
    micros = [mb for mini in tr.micro_batches(rows) for mb in mini]
    recomputed = torch.zeros(rows.ids.shape)
    for mb, logp in zip(micros, tr._frozen_logprobs(micros, reference=False)):
        recomputed[mb.idx, :logp.shape[1]] = logp.cpu()
    changed = diff = policy = 0
    retokenized = past_stop = 0
    for i, x in enumerate(trajs):
        n = len(x.ids)
        changed += int((rows.ids[i, :n] != torch.tensor(x.ids)).sum())
        sampled = torch.tensor([lp for s in x.steps for lp in s.logprobs])
        mask = rows.mask[i, :n].bool()
        diff = max(diff, float((recomputed[i, :n][mask] - sampled).abs().max()))
        policy += len(sampled)
        response = x.ids[len(x.prompt_ids):]
        retokenized += tok.encode(tok.decode(response), add_special_tokens=False) != response
        past_stop += sum(s.finish == "stop" and not tok.decode(s.gen_ids).endswith(STOP_STRINGS) for s in x.steps)
    lines = [f"`bench/token_drift.py --questions {args.questions}`: the smol preset's start, (2,2,1) trees, one "
             "training rollout.", "",
             "| trajectories | policy tokens | tokens changed | max abs log-prob difference | responses that "
             "re-encoding would change | steps whose last token runs past the stop string |", "|---" * 6 + "|",
             f"| {len(trajs)} | {policy} | {changed} | {diff:.1e} | {retokenized} of {len(trajs)} | {past_stop} |"]
    publish(lines, args.write, "token_drift")


if __name__ == "__main__":
    main()
