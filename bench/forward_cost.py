"""Where a rollout's time goes, forward by forward: chain G=4 vs tree (2,2,1) on the HF engine.

The rollout's wall-time goal (tree (2,2,1) at most 0.8x the chains' time per trajectory) is missed at
about 0.84x (`bench/rollout.py`). The tree needs more decode forwards than the chains, because its
expansion round starts after the last seed chain ends; starting a tree's expansion as soon as its own
seed chains end would merge those forwards into the seed round's. This script bounds what that can
save. Every forward (with its sampling) of chain and tree rollouts (the same questions, policy and
seeds as `bench/rollout.py`) is timed with its shape, and a least-squares fit over the decode forwards
(one new token per row; the others also feed observations or prefill),

    seconds = fixed + per_row * rows + per_column * rows * cache columns,

splits a forward's cost into a fixed part and its rows' work. Merging forwards keeps their rows' work
(the same rows, over at least as many padded columns), so it saves at most `fixed` per forward merged.
For comparison, the fit also prices the padding: the columns a row reads beyond its cached tokens.

    .venv/bin/python bench/forward_cost.py [--questions 32] [--reps 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import tg.engines.engine
from rollout import run_once, setup  # bench/rollout.py: the same policy, questions and sampling
from tg.engines.engine import HFBatch, HFEngine

SHAPES = {"chain G=4": (4, 0, 0), "tree (2,2,1)": (2, 2, 1)}


def instrument(record: list[list[float]]) -> None:
    """Time every `HFBatch._forward` and the sampling after it; append [rows, block, cache columns,
    cached tokens, seconds] per forward (the sampling's seconds are added to its forward's)."""
    forward, sample = HFBatch._forward, tg.engines.engine.sample_next

    def timed_forward(self: HFBatch, blocks, rows):
        n = self.rows_run(rows)  # the rows the forward computes
        shape = [n, max(len(b) for b in blocks), self.attn.shape[1], sum(len(c) for c in self.cached[:n])]
        t0 = time.perf_counter()
        out = forward(self, blocks, rows)
        record.append(shape + [time.perf_counter() - t0])
        return out

    def timed_sample(*args, **kwargs):
        t0 = time.perf_counter()
        out = sample(*args, **kwargs)
        record[-1][-1] += time.perf_counter() - t0
        return out

    HFBatch._forward, tg.engines.engine.sample_next = timed_forward, timed_sample


def fit(record: list[list[float]]) -> tuple[list[float], float]:
    """Least squares of seconds on [1, rows, rows * columns] over decode forwards; coefficients and R^2."""
    decode = [x for x in record if x[1] == 1]
    x = torch.tensor([[1.0, r, r * c] for r, _, c, _, _ in decode], dtype=torch.float64)
    y = torch.tensor([t for *_, t in decode], dtype=torch.float64)
    coef = torch.linalg.lstsq(x, y[:, None]).solution[:, 0]
    resid = y - x @ coef
    return coef.tolist(), float(1 - resid.square().sum() / (y - y.mean()).square().sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    _, model, tok, env, prompts = setup(args.questions, args.threads)
    engine = HFEngine(model, tok)
    record: list[list[float]] = []
    instrument(record)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SHAPES}
    every: list[list[float]] = []
    for rep in range(-1, args.reps):  # rep -1: untimed warm-up
        for name, shape in SHAPES.items():
            record.clear()
            t0 = time.perf_counter()
            led = run_once(engine, env, prompts, shape, seed=rep)
            total = time.perf_counter() - t0
            if rep < 0:
                continue
            every += record
            cells = sum(r * c for r, _, c, _, _ in record)
            runs[name].append({"s": total, "s_traj": total / led.trajectories, "forwards": len(record), "forward_s": sum(x[-1] for x in record),
                               "rows": statistics.mean(x[0] for x in record), "row_cols": cells / 1e6,
                               "real": sum(x[3] for x in record) / max(cells, 1)})
    (fixed, per_row, per_col), r2 = fit(every)
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    print(f"Medians of {args.reps} rollouts of {len(prompts)} multi-hop training questions, {args.threads} torch "
          f"thread(s). Fit over their decode forwards (R^2 {r2:.3f}): fixed {1000 * fixed:.2f} ms per forward, "
          f"{1e6 * per_row:.1f} us per row, {1e9 * per_col:.1f} ns per row x cache column.\n")
    print("| config | rollout s | forwards | s in forwards + sampling | mean rows per forward | "
          "rows x cache columns (M) | cached tokens / (rows x cache columns) | s/traj vs chain |\n"
          "|---|---|---|---|---|---|---|---|")
    chain, tree = med["chain G=4"], med["tree (2,2,1)"]
    for n, m in med.items():
        ratio = m["s_traj"] / chain["s_traj"]
        print(f"| {n} | {m['s']:.2f} | {m['forwards']:.0f} | {m['forward_s']:.2f} | {m['rows']:.0f} | "
              f"{m['row_cols']:.2f} | {m['real']:.2f} | {ratio:.2f}x |")
    extra = max(tree["forwards"] - chain["forwards"], 0)
    saved = extra * fixed
    ratio = tree["s_traj"] / chain["s_traj"]
    print(f"\nMerging the tree's {extra:.0f} extra forwards into the seed round saves at most {saved:.3f} s "
          f"({100 * saved / tree['s']:.1f}% of its rollout): s/traj vs chain {ratio:.2f}x -> at best "
          f"{ratio * (1 - saved / tree['s']):.2f}x.")
    pad = {n: (m["row_cols"] * (1 - m["real"])) * 1e6 * per_col for n, m in med.items()}
    print(f"Reading only each row's cached tokens (no padded columns) would save about {pad['tree (2,2,1)']:.3f} s "
          f"({100 * pad['tree (2,2,1)'] / tree['s']:.1f}%) of the tree's rollout and {pad['chain G=4']:.3f} s of the "
          f"chains': about {ratio * (1 - pad['tree (2,2,1)'] / tree['s']) / (1 - pad['chain G=4'] / chain['s']):.2f}x.")


if __name__ == "__main__":
    main()
