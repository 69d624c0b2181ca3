"""What keeping freed memory saves (tg.memory.keep_freed_memory, called by every Trainer): the same training
run with glibc's default allocator settings and with the trainer's, side by side.

Each repetition trains the cpu preset's pinned policy for `--steps` steps (tree (2,2,1), packed, the demo's
16 multi-hop questions per step, one torch thread) twice, in two fresh processes (the setting is process-wide
and cannot be undone), the order alternating between repetitions. The first step of each run is dropped; the
table gives medians over all kept steps by the trainer's own timers, and their ratio. Both runs must log the
same metrics to the last bit (the allocator changes no number); the script stops if they do not.

    .venv/bin/python bench/allocator.py [--steps 6] [--reps 3] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _blocks import same_metrics, step_medians, timer_table, write_section

MODES = ("glibc default", "keep freed memory")


def child(mode: str, steps: int) -> None:
    """One run in this process; prints its per-step rows as JSON."""
    import torch

    import tg.trainer
    from tg.config import load_config
    from tg.pipeline import build_run
    torch.set_num_threads(1)
    if mode == MODES[0]:
        tg.trainer.keep_freed_memory = lambda: False  # the trainer's call does nothing: glibc's defaults stay
    cfg = load_config("cpu").replace(tree=dict(M=2, N=2, L=1),
                                     optim=dict(steps=steps, checkpoint_every=steps, pack_trees=True))
    rows = build_run(cfg, tempfile.mkdtemp(prefix="tg-alloc-")).trainer.fit(progress=False)
    print(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--write", default=None, help="replace the allocator section of this markdown file")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.steps)
    steps: dict[str, list[dict]] = {m: [] for m in MODES}
    for rep in range(args.reps):
        runs = {}
        for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(args.steps)],
                                 check=True, capture_output=True, text=True).stdout
            runs[mode] = json.loads(out.splitlines()[-1])
            steps[mode] += runs[mode][1:]
        if not same_metrics(*runs.values()):
            sys.exit(f"repetition {rep}: the two runs logged different metrics; the allocator must change none")
    lines = [f"`bench/allocator.py --steps {args.steps} --reps {args.reps}`: medians of {len(steps[MODES[0]])} steps "
             "per setting (the first step of each run dropped); every metric equal to the last bit in every pair.", "",
             *timer_table({m: step_medians(rows) for m, rows in steps.items()}, base=MODES[0])]
    print("\n".join(lines))
    if args.write:
        write_section(Path(args.write), "allocator", "\n".join(lines))


if __name__ == "__main__":
    main()
