"""What a training step reports: one row per step, appended to runs/<run>/metrics.jsonl (docs/cli.md).
`METRICS` is the glossary of its columns; `step_metrics` builds the row from the step's leaf scores, token
ledger, advantages and update statistics (over several ranks, all of them gathered first)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:  # the glossary is read without torch (tg.experiments.summary)
    from tg.advantage import TreeAdvantage

METRICS: dict[str, str] = {
    "step": "training step (1-based)",
    "reward": "mean training reward over the step's leaves (the task's reward, Eq. 13 for search and calculator)",
    "em": "mean exact match of the leaves' last answers (no format term)",
    "format_valid": "share of leaves with a valid think/search/answer format",
    "tool_calls": "searches per question, summed over all its tree nodes",
    "tool_calls_per_traj": "searches on a root-to-leaf trajectory, mean over leaves",
    "generated": "policy tokens sampled per question (shared prefixes once)",
    "prefill": "context tokens the engine computed per question",
    "prefill_saved": "context tokens saved by prefix reuse per question",
    "trajectories": "leaves (training rows) per question",
    "zero_std_intra": "share of trees whose leaves all have the same reward (no intra-tree signal)",
    "zero_std_inter": "share of questions whose leaves all have the same reward (no inter-tree signal)",
    "adv_mean": "mean advantage over rows", "adv_std": "std of the advantage over rows",
    "adv_intra_std": "std of the intra-tree part", "adv_inter_std": "std of the inter-tree part",
    "loss": "total loss of the step's last mini-batch", "pg_loss": "policy-gradient part",
    "kl": "K3 KL to the reference, aggregated like the loss", "clip_frac": "share of policy tokens clipped",
    "entropy": "policy entropy on policy tokens, aggregated like the loss", "grad_norm": "global grad norm before clipping",
    "lr": "learning rate",
    "sync_maxdiff": "vLLM engine only: max |log-prob| gap on a probe between the engine and the trainer after sync",
    "rollout_s": "rollout wall seconds", "logprob_s": "reference (and old, with several mini-batches) log-prob seconds",
    "update_s": "advantages + forward/backward + optimiser + engine sync seconds",
}
TIMERS = ("rollout_s", "logprob_s", "update_s")
"""The timed pieces of a step (seconds, in `METRICS`); their sum is the step's training time."""


def zero_std_share(values: Sequence[float], groups: Sequence[int]) -> float:
    """The share of groups whose values are all equal (a group without signal)."""
    by: dict[int, set[float]] = {}
    for v, g in zip(values, groups):
        by.setdefault(g, set()).add(v)
    return sum(len(s) == 1 for s in by.values()) / max(len(by), 1)


def step_metrics(step: int, sc: dict[str, list], led: dict[str, float], adv: TreeAdvantage,
                 stats: dict[str, float]) -> dict[str, float]:
    """The metrics row of step `step`: `sc` from tg.batch.leaf_rewards, `led` the step's token ledger per
    question (tg.budget.Ledger.per), `adv` the advantages' parts, `stats` the update's and the timers."""
    return {"step": step, "reward": float(np.mean(sc["reward"])), "em": float(np.mean(sc["em"])),
            "format_valid": float(np.mean(sc["valid"])), "tool_calls": led["tool_calls"],
            "tool_calls_per_traj": float(np.mean(sc["calls"])), "generated": led["generated"],
            "prefill": led["prefill_computed"], "prefill_saved": led["prefill_saved"],
            "trajectories": led["trajectories"], "zero_std_intra": zero_std_share(sc["reward"], sc["tree"]),
            "zero_std_inter": zero_std_share(sc["reward"], sc["prompt"]),
            "adv_mean": float(adv.total.mean()), "adv_std": float(adv.total.std()),
            "adv_intra_std": float(adv.intra.std()), "adv_inter_std": float(adv.inter.std()),
            **{k: stats[k] for k in ("loss", "pg_loss", "kl", "clip_frac", "entropy", "grad_norm", "lr",
                                     "sync_maxdiff") if k in stats},
            **{k: stats[k] for k in TIMERS}}
