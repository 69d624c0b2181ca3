"""The same training runs at two revisions of the kit, side by side: what a change to the step saves, and that it
changes no number.

Each repetition trains the cpu preset's pinned policy for `--steps` steps (16 multi-hop questions per step, one
torch thread) at every tree shape of `--shapes`, once with the base revision (a git worktree of `--base`) and once
with this checkout, each in a fresh process, the order alternating between repetitions. Both runs of a pair must
log the same metrics to the last bit; the script stops if they do not. The first step of each run is dropped; the
table gives medians of the trainer's timers per shape and revision, and the median of the paired per-step ratios
(this checkout / base: step k of one run against step k of the other, same rollout, same rows).

    .venv/bin/python bench/revisions.py [--base HEAD] [--shapes 4,0,0 2,2,1 8,2,1] [--steps 4] [--reps 3]
                                        [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _blocks import same_metrics, step_medians, write_section

from tg.metrics import TIMERS

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import json, sys, tempfile, torch
from tg.config import load_config
from tg.pipeline import build_run
torch.set_num_threads(1)
M, N, L, steps = map(int, sys.argv[1:5])
cfg = load_config("cpu").replace(tree=dict(M=M, N=N, L=L), optim=dict(steps=steps, checkpoint_every=steps))
print(json.dumps(build_run(cfg, tempfile.mkdtemp(prefix="tg-rev-")).trainer.fit(progress=False)))
"""
"""One run in a fresh process, importing `tg` from the checkout it runs in (the same code at both revisions)."""


def run(checkout: Path, shape: tuple[int, int, int], steps: int) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, *map(str, shape), str(steps)], cwd=checkout, env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD", help="the git revision to compare this checkout with")
    ap.add_argument("--shapes", nargs="+", default=["4,0,0", "2,2,1", "8,2,1"], help="tree shapes M,N,L")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--write", default=None, help="replace the revisions section of this markdown file")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes]
    base_sha = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout.strip()
    names = (f"base {base_sha}", "this checkout")
    steps = {(s, n): [] for s in shapes for n in names}
    ratios: dict[tuple, list[float]] = {s: [] for s in shapes}
    with tempfile.TemporaryDirectory(prefix="tg-base-") as tmp:
        base = Path(tmp) / "tg"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for rep in range(args.reps):
                for shape in shapes:
                    order = [(names[0], base), (names[1], ROOT)]
                    runs = {n: run(c, shape, args.steps) for n, c in (order if rep % 2 == 0 else order[::-1])}
                    a, b = runs[names[0]], runs[names[1]]
                    if not same_metrics(a, b):
                        sys.exit(f"shape {shape}, repetition {rep}: the two revisions logged different metrics")
                    for n in names:
                        steps[shape, n] += runs[n][1:]
                    ratios[shape] += [sum(y[p] for p in TIMERS) / sum(x[p] for p in TIMERS)
                                      for x, y in zip(a[1:], b[1:])]
                    print(f"repetition {rep + 1}/{args.reps}, shape {shape}: equal metrics", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    lines = [f"`bench/revisions.py --base {args.base} --steps {args.steps} --reps {args.reps}` (base {base_sha}): "
             f"medians of {args.reps * (args.steps - 1)} steps per shape and revision (the first step of each run "
             "dropped); every metric equal to the last bit in every pair.", "",
             "| (M,N,L) | " + " | ".join(f"{n}: {p}" for n in names for p in (*TIMERS, "step_s"))
             + " | step ratio (paired median, range) |", "|---" * (2 + 2 * (len(TIMERS) + 1)) + "|"]
    for shape in shapes:
        med = [step_medians(steps[shape, n]) for n in names]
        cells = [f"{m[p]:.2f} s" for m in med for p in (*TIMERS, "step_s")]
        r = ratios[shape]
        lines.append(f"| ({','.join(map(str, shape))}) | {' | '.join(cells)} | "
                     f"{statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f}) |")
    print("\n".join(lines))
    if args.write:
        write_section(Path(args.write), "revisions", "\n".join(lines))


if __name__ == "__main__":
    main()
