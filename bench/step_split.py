"""Where a training step's time goes: chain GRPO (G=4) vs Tree-GRPO (2,2,1) at equal budget, one run (the tree
twice: on the cpu preset with rows trained one by one and packed per tree, on the smol preset with LoRA and QLoRA).

Each run trains the preset's warmed-up policy (`--preset`: cpu, the tiny model with the demo's 16 multi-hop
questions per step; smol, SmolLM2-135M with LoRA and that preset's questions per step) for `--steps` steps, the
chain first; the trainer's own timers split each step into rollout (`rollout_s`), reference/old log-probs
(`logprob_s`) and the rest of the update (`update_s`). The first step of each run is dropped (warm-up); the table
gives medians and tree / chain ratios, and the policy tokens each sampled per question (`generated`), whose ratio
is what the tree's step would cost if time followed tokens.

    .venv/bin/python bench/step_split.py [--preset cpu] [--steps 6] [--threads 2] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch
from _blocks import publish, step_medians, timer_table

from tg.config import load_config
from tg.pipeline import build_run

CHAIN, TREE = dict(M=4, N=0, L=0), dict(M=2, N=2, L=1)
RUNS = {"cpu": {"chain G=4": dict(tree=CHAIN, optim=dict(pack_trees=False)),
                "tree (2,2,1)": dict(tree=TREE, optim=dict(pack_trees=False)),
                "tree (2,2,1) packed": dict(tree=TREE, optim=dict(pack_trees=True))},
        "smol": {"chain G=4": dict(tree=CHAIN), "tree (2,2,1)": dict(tree=TREE),
                 "tree (2,2,1) QLoRA": dict(tree=TREE, model=dict(finetune="qlora"))}}
"""preset -> name -> the config groups each run changes (the smol preset packs trees; its third run is QLoRA)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--preset", default="cpu", choices=sorted(RUNS))
    ap.add_argument("--write", default=None, help="replace the step_split section of this markdown file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.preset)
    medians: dict[str, dict[str, float]] = {}
    for name, groups in RUNS[args.preset].items():
        optim = dict(steps=args.steps, checkpoint_every=args.steps) | groups.get("optim", {})
        run_cfg = cfg.replace(**{**groups, "optim": optim})
        rows = build_run(run_cfg, tempfile.mkdtemp(prefix="tg-split-")).trainer.fit()[1:]
        medians[name] = step_medians(rows) | {"generated": statistics.median(r["generated"] for r in rows)}
    section = "step_split" if args.preset == "cpu" else f"step_split_{args.preset}"
    lines = [f"`bench/step_split.py --preset {args.preset} --steps {args.steps} --threads {args.threads}`: medians of "
             f"{args.steps - 1} steps after one untimed step.", "", *timer_table(medians, base="chain G=4"),
             "| generated tokens / q | " + " | ".join(f"{m['generated']:.0f}" for m in medians.values()) + " | "
             + " | ".join(f"{m['generated'] / medians['chain G=4']['generated']:.2f}x" for n, m in medians.items()
                          if n != "chain G=4") + " |"]
    publish(lines, args.write, section)


if __name__ == "__main__":
    main()
