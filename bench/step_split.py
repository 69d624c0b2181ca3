"""Where a training step's time goes: chain GRPO (G=4) vs Tree-GRPO (2,2,1) at equal budget, one run
(the tree twice: rows trained one by one, and packed per tree with `optim.pack_trees`).

Each run trains the cpu preset's warmed-up policy for `--steps` steps with the demo's settings (16 multi-hop
questions per step), the chain first; the trainer's own timers split each step into rollout
(`rollout_s`), reference/old log-probs (`logprob_s`) and the rest of the update (`update_s`). The
first step of each run is dropped (warm-up); the table gives medians and tree / chain ratios.

    .venv/bin/python bench/step_split.py [--steps 6] [--threads 2] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import tempfile

from pathlib import Path

import torch
from _blocks import step_medians, timer_table, write_section

from tg.config import load_config
from tg.pipeline import build_run

RUNS = {"chain G=4": (dict(M=4, N=0, L=0), False), "tree (2,2,1)": (dict(M=2, N=2, L=1), False),
        "tree (2,2,1) packed": (dict(M=2, N=2, L=1), True)}
"""name: (tree shape, optim.pack_trees)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", default=None, help="replace the step_split section of this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config("cpu")
    medians: dict[str, dict[str, float]] = {}
    for name, (shape, pack) in RUNS.items():
        run_cfg = cfg.replace(tree=shape, optim=dict(steps=args.steps, checkpoint_every=args.steps, pack_trees=pack))
        rows = build_run(run_cfg, tempfile.mkdtemp(prefix="tg-split-")).trainer.fit()[1:]
        medians[name] = step_medians(rows)
    lines = [f"`bench/step_split.py --steps {args.steps} --threads {args.threads}`: medians of {args.steps - 1} steps "
             "after one untimed step.", "", *timer_table(medians, base="chain G=4")]
    print("\n".join(lines))
    if args.write:
        write_section(Path(args.write), "step_split", "\n".join(lines))


if __name__ == "__main__":
    main()
