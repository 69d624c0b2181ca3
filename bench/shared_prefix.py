"""What running a micro-batch's common start once saves the update: the trainer's forward + loss + backward of one
step's micro-batches, and its reference forward, with the rows' shared prefix (the prompt's instructions) run once
against every row running it, on the same rows in one process.

One rollout of the cpu preset's pinned policy per shape (16 multi-hop questions, one torch thread) gives fixed
training rows; the trainer builds its micro-batches twice, with `share_prefix` on and off; then, alternating the
order, `--reps` times each: the training forward, loss and backward over the step's micro-batches
(`Trainer._micro_loss`, gradients discarded, so the weights stay put) and the reference forward. Medians of the
repetitions after the first. The reference log-probs of both ways are compared too (largest difference: float
summation order).

    .venv/bin/python bench/shared_prefix.py [--shapes 4,0,0 2,2,1 8,2,1] [--reps 7] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from _blocks import write_section

from tg.config import load_config
from tg.pipeline import build_run


def timings(shape: tuple[int, int, int], reps: int) -> dict[str, float]:
    cfg = load_config("cpu").replace(tree=dict(M=shape[0], N=shape[1], L=shape[2]), optim=dict(steps=1))
    tr = build_run(cfg, tempfile.mkdtemp(prefix="tg-sp-")).trainer
    seen = []
    update = tr.update
    tr.update = lambda rows: seen.append(rows) or update(rows)
    tr.step()
    rows, model = seen[0], tr.policy.model
    micros = {}
    for share in (True, False):
        tr.share_prefix = share
        micros[share] = [mb for mini in tr._micro_batches(rows) for mb in mini]
    refs = {share: tr._frozen_logprobs(micros[share], reference=True) for share in micros}
    diff = max(float((a - b).abs().max()) for a, b in zip(refs[True], refs[False], strict=True))

    def train(share: bool) -> None:
        model.train()
        for mb, ref in zip(micros[share], refs[share]):
            tr._micro_loss(rows, mb, None, ref, 1.0)
        model.zero_grad(set_to_none=True)

    runs: dict[str, Callable[[], None]] = {"update, every row": lambda: train(False),
                                           "update, shared once": lambda: train(True),
                                           "reference, every row": lambda: tr._frozen_logprobs(micros[False], True),
                                           "reference, shared once": lambda: tr._frozen_logprobs(micros[True], True)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for rep in range(reps):
        for name in (list(runs) if rep % 2 else list(runs)[::-1]):
            t0 = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t0)
    out = {k: statistics.median(v[1:]) for k, v in times.items()}
    out["shared"] = statistics.median(mb.shared for mb in micros[True])
    out["diff"] = diff
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["4,0,0", "2,2,1", "8,2,1"], help="tree shapes M,N,L")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--write", default=None, help="replace the shared_prefix section of this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lines = [f"`bench/shared_prefix.py --reps {args.reps}`: medians of {args.reps - 1} repetitions (the first dropped), "
             "one step's micro-batches, one torch thread.", "",
             "| (M,N,L) | shared positions | update, every row | update, shared once | ratio | reference, every row | "
             "reference, shared once | ratio | reference log-probs, largest difference |", "|---|---|---|---|---|---|---|---|---|"]
    for s in args.shapes:
        m = timings(tuple(int(x) for x in s.split(",")), args.reps)
        lines.append(f"| ({s}) | {m['shared']:.0f} | {m['update, every row']:.2f} s | {m['update, shared once']:.2f} s | "
                     f"{m['update, shared once'] / m['update, every row']:.2f}x | {m['reference, every row']:.2f} s | "
                     f"{m['reference, shared once']:.2f} s | "
                     f"{m['reference, shared once'] / m['reference, every row']:.2f}x | {m['diff']:.1e} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    if args.write:
        write_section(Path(args.write), "shared_prefix", "\n".join(lines))


if __name__ == "__main__":
    main()
