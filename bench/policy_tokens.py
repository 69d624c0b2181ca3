"""What taking log-probs at policy tokens only saves the update: the trainer's forward + loss + backward of one
step's micro-batches against the same forward with the log-softmax and entropy over whole rows, in one process.

One rollout of the cpu preset's pinned policy per shape (16 multi-hop questions, one torch thread) gives fixed
training rows; then, alternating the order, `--reps` times each: the trainer's training forward, loss and backward
over the step's micro-batches (`Trainer._micro_loss`, gradients discarded, so the weights stay put) and the same with
whole rows (`tg.loss.token_logprobs` and the entropy over [rows, width, vocabulary], then the masked loss: the
update before this change, less its reordering of packed rows into micro-batch order); and the reference forward
both ways. Medians of the repetitions after the first.

    .venv/bin/python bench/policy_tokens.py [--shapes 4,0,0 2,2,1 8,2,1] [--reps 7] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from _blocks import write_section

from tg.config import load_config
from tg.loss import entropy, grpo_loss, token_logprobs
from tg.packing import packed_logits
from tg.pipeline import build_run


def timings(shape: tuple[int, int, int], reps: int) -> dict[str, float]:
    cfg = load_config("cpu").replace(tree=dict(M=shape[0], N=shape[1], L=shape[2]), optim=dict(steps=1))
    tr = build_run(cfg, tempfile.mkdtemp(prefix="tg-pt-")).trainer
    tr.share_prefix = False  # whole rows in both ways: only the log-softmax's extent differs (bench/shared_prefix.py)
    seen = []
    update = tr.update
    tr.update = lambda rows: seen.append(rows) or update(rows)
    tr.step()
    rows, o, model = seen[0], cfg.optim, tr.policy.model
    micros = [mb for mini in tr._micro_batches(rows) for mb in mini]
    refs = tr._frozen_logprobs(micros, reference=True)

    def whole(m, mb):  # every row position's logits (rows in tree order when packed)
        return m(input_ids=mb.ids).logits if mb.packed is None else packed_logits(m, mb.packed)[mb.packed.where]

    def train(fast: bool) -> None:
        model.train()
        for mb, ref in zip(micros, refs):
            if fast:
                tr._micro_loss(rows, mb, None, ref, 1.0)
                continue
            logits = whole(model, mb)
            logp = token_logprobs(logits, mb.ids)
            ent = F.pad(entropy(logits.detach()[:, :-1]), (1, 0))
            mask = rows.mask[mb.idx, :mb.ids.shape[1]].float()
            loss, _ = grpo_loss(logp, logp.detach(), rows.adv[mb.idx], mask, ref_logp=ref, entropy=ent,
                                clip_low=o.clip_low, clip_high=o.clip_high, agg=o.loss_agg, kl_beta=o.kl_beta)
            loss.backward()
        model.zero_grad(set_to_none=True)

    @torch.no_grad()
    def reference(fast: bool) -> None:
        with tr.policy.reference_context():
            for mb in micros:
                (tr._forward_logprobs(tr.policy.reference_model, mb) if fast
                 else token_logprobs(whole(tr.policy.reference_model, mb), mb.ids))

    runs: dict[str, Callable[[], None]] = {"update, whole rows": lambda: train(False),
                                           "update, policy tokens": lambda: train(True),
                                           "reference, whole rows": lambda: reference(False),
                                           "reference, policy tokens": lambda: reference(True)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for rep in range(reps):
        for name in (list(runs) if rep % 2 else list(runs)[::-1]):
            t0 = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v[1:]) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["4,0,0", "2,2,1", "8,2,1"], help="tree shapes M,N,L")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--write", default=None, help="replace the policy_tokens section of this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lines = [f"`bench/policy_tokens.py --reps {args.reps}`: medians of {args.reps - 1} repetitions (the first dropped), "
             "one step's micro-batches, one torch thread.", "",
             "| (M,N,L) | update, whole rows | update, policy tokens | ratio | reference, whole rows | "
             "reference, policy tokens | ratio |", "|---|---|---|---|---|---|---|"]
    for s in args.shapes:
        m = timings(tuple(int(x) for x in s.split(",")), args.reps)
        lines.append(f"| ({s}) | {m['update, whole rows']:.2f} s | {m['update, policy tokens']:.2f} s | "
                     f"{m['update, policy tokens'] / m['update, whole rows']:.2f}x | {m['reference, whole rows']:.2f} s | "
                     f"{m['reference, policy tokens']:.2f} s | "
                     f"{m['reference, policy tokens'] / m['reference, whole rows']:.2f}x |")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    if args.write:
        write_section(Path(args.write), "policy_tokens", "\n".join(lines))


if __name__ == "__main__":
    main()
