"""Where a training step's time goes: chain GRPO (G=4) vs Tree-GRPO (2,2,1) at equal budget, one run.

Both train the cpu preset's warmed-up policy for `--steps` steps with the demo's settings (16 multi-hop
questions per step), the chain first; the trainer's own timers split each step into rollout
(`rollout_s`), reference/old log-probs (`logprob_s`) and the rest of the update (`update_s`). The
first step of each run is dropped (warm-up); the table gives medians and tree / chain ratios.

    .venv/bin/python bench/step_split.py [--steps 6] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch

from tg.commands import build_run
from tg.config import load_config

PARTS = ("rollout_s", "logprob_s", "update_s")
SHAPES = {"chain G=4": dict(M=4, N=0, L=0), "tree (2,2,1)": dict(M=2, N=2, L=1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config("cpu")
    medians: dict[str, dict[str, float]] = {}
    for name, shape in SHAPES.items():
        run_cfg = cfg.replace(tree=shape, optim=dict(steps=args.steps, checkpoint_every=args.steps))
        rows = build_run(run_cfg, tempfile.mkdtemp(prefix="tg-split-")).trainer.fit()[1:]
        medians[name] = {p: statistics.median(r[p] for r in rows) for p in PARTS}
        medians[name]["step_s"] = statistics.median(sum(r[p] for p in PARTS) for r in rows)
    chain, tree = medians.values()
    print(f"| part | {' | '.join(medians)} | tree / chain |\n|---|---|---|---|")
    for part in (*PARTS, "step_s"):
        print(f"| {part} | {chain[part]:.2f} s | {tree[part]:.2f} s | {tree[part] / chain[part]:.2f}x |")


if __name__ == "__main__":
    main()
