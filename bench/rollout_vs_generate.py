"""A whole rollout against transformers' batched `generate` on a real model (the smol preset's SmolLM2-135M start).

Decoding alone is not the cost of a step: a rollout also prefills observations between turns, opens branches from
their parents' caches and keeps its bookkeeping. This bench times, interleaved and side by side, (a) the trainer's
rollout of `--questions` training questions as chains (G=4) and as trees (2,2,1), and (b)
`model.generate` with as many rows as that rollout has trajectories, each forced to the rollout's mean policy
tokens per trajectory, from the same prompts, at the same temperature and top-p, on the weights the rollout samples
from (the engine's model after the trainer's sync: for LoRA, the adapters folded in). Policy tokens per second of
(a) over (b) is the ratio the kit's rollout keeps of plain decoding: of the medians, and per repetition (the two
timed one after the other; sorted), which shows how far the ratio moves on a noisy host. The rollout's time is split
into its forwards that prefill (the prompts once, each observation after a search: work `generate` never does) and
the rest. Its forwards that sample (one token per row each) are counted beside the fewest any schedule of these
trees could run, since a token waits for the one before it in its trajectory and a branch for the end of its tree's
seed chain (the node it starts from is drawn from the whole chain): the longest such path, in policy tokens;
`generate` runs one forward per token of its rows. (c) The same rollout on peft's unfolded LoRA model, interleaved
too, is what folding saves (the start's adapters are zero, so both sample the same tokens: checked).

    .venv/bin/python bench/rollout_vs_generate.py [--questions 8] [--reps 3] [--threads 2] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator

import torch
from _blocks import publish

import tg.engines.engine
from tg.budget import Ledger
from tg.config import load_config
from tg.engines.engine import HFBatch
from tg.pipeline import build_run


@contextmanager
def forward_clock(spent: list[float]) -> Iterator[None]:
    """Add to spent[0] the seconds of every engine forward that feeds some row more than one token, and count the
    forwards that sample (one token per fed row) in spent[1]."""
    forward, sample = HFBatch._forward, tg.engines.engine.sample_next

    def counted(*args, **kwargs):
        spent[1] += 1
        return sample(*args, **kwargs)

    def timed(self, blocks, rows):
        t0 = time.perf_counter()
        out = forward(self, blocks, rows)
        if max(map(len, blocks)) > 1:
            spent[0] += time.perf_counter() - t0
        return out

    HFBatch._forward, tg.engines.engine.sample_next = timed, counted
    try:
        yield
    finally:
        HFBatch._forward, tg.engines.engine.sample_next = forward, sample


def fewest_forwards(trees: list) -> int:
    """The fewest forwards that sample any schedule could grow these trees in: the longest chain of tokens that wait for
    each other, a seed chain's policy tokens plus, for a branch, the branch's own (a tree's seed chain is the nodes
    up to its first leaf; its branches start once it has ended)."""
    longest = 0
    for tree in (t for ts in trees for t in ts):
        first = tree.leaves()[0]
        seed = sum(len(tree.nodes[i].step.gen_ids) for i in range(1, first + 1))
        for leaf in tree.leaves():
            own, node = 0, leaf
            while node > first:
                own += len(tree.nodes[node].step.gen_ids)
                node = tree.nodes[node].parent
            longest = max(longest, seed + own)
    return longest


def _sampled(trees: list) -> list[list[int]]:
    return [n.step.gen_ids for ts in trees for t in ts for n in t.nodes if n.step is not None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--preset", default="smol")
    ap.add_argument("--write", default=None, help="replace the rollout_vs_generate section of this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines = [f"`bench/rollout_vs_generate.py --questions {args.questions} --reps {args.reps} --threads "
             f"{args.threads}`: medians of {args.reps} repetitions, interleaved; the {args.preset} preset's start.", "",
             "| rollout | trajectories | policy tokens | rollout s | of it prefill s | rollout tok/s | generate s | "
             "generate tok/s | rollout / generate | per repetition | without prefill | sampling forwards | "
             "fewest possible | generate forwards | unfolded LoRA rollout s |",
             "|---" * 15 + "|"]
    for shape in (dict(M=4, N=0, L=0), dict(M=2, N=2, L=1)):
        cfg = load_config(args.preset).replace(tree=shape, optim=dict(prompts_per_step=args.questions,
                                                                      mini_batch_prompts=args.questions))
        tr = build_run(cfg, tempfile.mkdtemp(prefix="tg-bench-")).trainer
        tr.engine.sync(tr.policy.model)  # as the trainer does before its first rollout
        questions = tr.batch_questions(0)
        times: dict[str, list[float]] = {"rollout": [], "generate": []}
        tokens = rows = 0
        for rep in range(args.reps):
            spent = [0.0, 0]
            t0 = time.perf_counter()
            with forward_clock(spent):
                trees, leds = tr.rollout(questions, rep)
            times["rollout"].append(time.perf_counter() - t0)
            times.setdefault("prefill", []).append(spent[0])
            times.setdefault("forwards", []).append(spent[1])
            times.setdefault("fewest", []).append(fewest_forwards(trees))
            tr.engine.model = tr.policy.model  # (c): peft's model, adapters unfolded
            t0 = time.perf_counter()
            unfolded, _ = tr.rollout(questions, rep)
            times.setdefault("unfolded", []).append(time.perf_counter() - t0)
            tr.engine.model = tr.engine.folded
            assert _sampled(unfolded) == _sampled(trees), "the unfolded rollout sampled other tokens"
            led = Ledger.total(leds)
            tokens, rows = led.generated, led.trajectories
            per_row = max(1, round(tokens / rows))
            prompts = [tr.env.prompt_ids(questions[t.question].question) for ts in trees for t in ts
                       for _ in t.leaves()]
            width = max(map(len, prompts))
            ids = torch.tensor([[tr.pad_id] * (width - len(p)) + p for p in prompts])  # left-padded
            attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            t0 = time.perf_counter()
            with torch.no_grad():
                tr.engine.model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0,
                                         top_p=cfg.agent.top_p, max_new_tokens=per_row, min_new_tokens=per_row,
                                         pad_token_id=tr.pad_id)
            times["generate"].append(time.perf_counter() - t0)
            times.setdefault("generate_tokens", []).append(per_row * len(prompts))
            times.setdefault("generate_forwards", []).append(per_row)
            times.setdefault("rollout_tokens", []).append(tokens)
        med = {k: statistics.median(v) for k, v in times.items()}
        r_tps, g_tps = med["rollout_tokens"] / med["rollout"], med["generate_tokens"] / med["generate"]
        paired = sorted(r_tok / r_s / (g_tok / g_s) for r_tok, r_s, g_tok, g_s in  # tok/s ratio per repetition
                        zip(times["rollout_tokens"], times["rollout"], times["generate_tokens"], times["generate"]))
        name = "chain G=4" if shape["N"] == 0 else "tree (2,2,1)"
        d_tps = med["rollout_tokens"] / (med["rollout"] - med["prefill"])
        lines.append(f"| {name} | {rows} | {med['rollout_tokens']:.0f} | {med['rollout']:.1f} | {med['prefill']:.1f} | "
                     f"{r_tps:.0f} | {med['generate']:.1f} | {g_tps:.0f} | {r_tps / g_tps:.2f}x | "
                     f"{', '.join(f'{x:.2f}x' for x in paired)} | {d_tps / g_tps:.2f}x | {med['forwards']:.0f} | "
                     f"{med['fewest']:.0f} | {med['generate_forwards']:.0f} | {med['unfolded']:.1f} |")
        print(lines[-1], flush=True)
    publish(lines, args.write, "rollout_vs_generate")


if __name__ == "__main__":
    main()
