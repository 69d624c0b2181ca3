"""What each node-selection strategy costs at the same tree shape (tg.tree.NODE_RULES), on the CPU preset.

For the same questions, policy and seeds, every rule grows (M, N, L) trees from the same seed chains (the
node-choice rng does not touch the engine's sampling); the table gives per-question means over the seeds:
trajectories, branches, mean depth of the nodes the branches start from, generated and observation tokens,
tool calls, the cost in this policy's chains (`tg.budget.measured_equivalent` against chains of the matched
group size), and the largest gap between the entropies the HF engine reported and a full forward's.

    .venv/bin/python bench/node_rules.py [--questions 32] [--seeds 5] [--threads 1] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
from pathlib import Path

import torch

from _blocks import write_section
from rollout import provenance, setup

from tg.budget import Ledger, ledgers, matched_chain_group, measured_equivalent
from tg.engines.engine import HFEngine, Sampling
from tg.tree import NODE_RULES, Tree, sample_trees


def entropy_gap(model, trees: list[list[Tree]]) -> float:
    """Max |reported - recomputed| entropy over every policy token of every trajectory (one full forward each)."""
    gap = 0.0
    for tr in (t.trajectory(leaf) for ts in trees for t in ts for leaf in t.leaves()):
        with torch.no_grad():
            logits = model(torch.tensor([tr.ids])).logits[0, :-1].float()      # [T-1, V]
        at = [i - 1 for i, m in enumerate(tr.mask) if m]
        full = torch.distributions.Categorical(logits=logits[at]).entropy()
        gap = max(gap, (full - torch.tensor([h for s in tr.steps for h in s.entropies])).abs().max().item())
    return gap


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--shape", default="2,2,1", help="M,N,L")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--write", default=None, help="replace the node-rules table in this markdown file")
    args = ap.parse_args()
    load_before = os.getloadavg()
    res, model, tok, env, prompts = setup(args.questions, args.threads)
    M, N, L = map(int, args.shape.split(","))
    engine, n_q = HFEngine(model, tok), len(prompts)
    rows: dict[str, list[dict[str, float]]] = {rule: [] for rule in NODE_RULES}
    for seed in range(args.seeds):
        kw = dict(sampling=Sampling(1.0, 0.95, seed), max_step_tokens=500, max_context_tokens=4096)
        chains = Ledger.total(ledgers(*sample_trees(engine, env, prompts, M=matched_chain_group(M, N, L), N=0, L=0,
                                                    rng=random.Random(seed), **kw)))
        for rule in NODE_RULES:
            trees, stats = sample_trees(engine, env, prompts, M=M, N=N, L=L, node_rule=rule, rng=random.Random(seed),
                                        **kw)
            per_q, flat = ledgers(trees, stats), [t for ts in trees for t in ts]
            total = Ledger.total(per_q)
            starts = [t.nodes[b].depth for t in flat for b in t.branch_points()]
            rows[rule].append({"traj/q": total.trajectories / n_q, "branches/tree": len(starts) / len(flat),
                               "start depth": statistics.mean(starts), "gen tok/q": total.generated / n_q,
                               "obs tok/q": total.observation / n_q, "calls/q": total.tool_calls / n_q,
                               "chains/q": statistics.mean(measured_equivalent(x, chains) for x in per_q),
                               "max dH": entropy_gap(model, trees)})
    keys = list(rows["paper"][0])
    lines = [f"Shape (M, N, L) = ({M}, {N}, {L}), {n_q} multi-hop training questions, warmed-up tiny policy, "
             f"temperature 1, top-p 0.95, seeds 0-{args.seeds - 1}: means over the seeds; chains/q against chains "
             f"G={matched_chain_group(M, N, L)} of the same seeds; max dH: the largest |entropy the engine reported - "
             "a full forward's| in nats, over every policy token of every seed.", "",
             "| rule | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for rule, rs in rows.items():
        vals = [max(r[k] for r in rs) if k == "max dH" else statistics.mean(r[k] for r in rs) for k in keys]
        lines.append(f"| {rule} | " + " | ".join(f"{v:.2g}" if k == "max dH" else f"{v:.2f}"
                                                   for k, v in zip(keys, vals)) + " |")
    table = provenance(args.threads, load_before, False, res.policy_path) + "\n\n" + "\n".join(lines)
    print(table)
    if args.write:
        write_section(Path(args.write), "node_rules", table)


if __name__ == "__main__":
    main()
