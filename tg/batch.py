"""A step's batch, from sampled trees to the model's inputs (the trainer's steps 3-4, tg.trainer):

- `leaf_rewards`: every leaf scored by the task's reward (Eq. 13 for search), with its EM and format;
- `leaf_advantages`: each leaf's advantage from the rewards (Eq. 5-7; chains: GRPO by prompt, with GiGPO's
  step groups where `optim.step_groups`); `check_replaceable`: whether a config's advantage and loss are the
  plain Eq. 7-8 that a function of one's own (`Trainer.advantage_fn`, `Trainer.loss_fn`) may replace;
- `build_rows`: one training row per leaf, the exact sampled ids and observation mask (shared prefixes repeat),
  with its advantage (one per trajectory, or one per step with step groups: `chain_states` gives the states);
- `micro_batches`: the PPO mini-batches' micro-batches, each a `Micro` of model inputs (`micro_inputs`).

Pure functions of the trees, the rewards and the config: no model, no optimiser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from tg.advantage import (TreeAdvantage, combine_step_advantages, observation_prefixes, step_group_advantages,
                          tree_grpo_parts)
from tg.agent.contract import checked_reward
from tg.agent.env import Reward
from tg.config import ConfigError, OptimConfig
from tg.gpu.distributed import minibatch_of
from tg.packing import PackedBatch, common_prefix, pack_batch, rows_batch
from tg.reward import answer_score, is_valid_format
from tg.tree import Tree


def leaf_rewards(trees: Sequence[Tree], golds: Sequence[Sequence[str]], reward_fn: Reward,
                 questions: Sequence[str] = ()) -> dict[str, list]:
    """Score every leaf with `reward_fn` (filling `tree.rewards`); returns per-leaf reward, EM, format validity, ids.
    Each reward is held to its contract (`tg.agent.contract.checked_reward`; `questions[q]` names question q)."""
    out: dict[str, list] = {k: [] for k in ("reward", "em", "valid", "tree", "prompt", "calls")}
    for k, tree in enumerate(trees):
        for leaf in tree.leaves():
            texts = [s.text for s in tree.path(leaf)]
            q = tree.question
            tree.rewards[leaf] = checked_reward(reward_fn, texts, golds[q], questions[q] if questions else f"#{q}")
            out["reward"].append(tree.rewards[leaf])
            out["em"].append(answer_score("".join(texts), golds[tree.question]))
            out["valid"].append(float(is_valid_format(texts)))
            out["tree"].append(k)
            out["prompt"].append(tree.question)
            out["calls"].append(tree.trajectory(leaf).tool_calls)
    return out


def chain_states(tree: Tree) -> list[tuple]:
    """The state each step of a chain acts from: the observations so far, as exact ids (GiGPO's anchor state;
    the prompt is the step group's key beside it). A chain of K steps has K states."""
    (leaf,) = tree.leaves()
    return observation_prefixes([tuple(s.obs_ids) for s in tree.path(leaf)[:-1]])


def leaf_advantages(sc: dict[str, list], trees: Sequence[Tree], o: OptimConfig,
                    chain: bool) -> tuple[TreeAdvantage, torch.Tensor]:
    """The advantages' parts of the leaves scored in `sc` (tg.advantage.tree_grpo_parts; chains: GRPO by prompt)
    and each row's advantage: the parts' total, [R], or with `optim.step_groups` (chains only, Config checks)
    GiGPO's step-group advantage added per step, [R, K]."""
    rewards = torch.tensor(sc["reward"], dtype=torch.float64)
    adv = tree_grpo_parts(rewards, torch.tensor(sc["tree"]), torch.tensor(sc["prompt"]),
                          mode="chain" if chain else o.advantage, eps=o.adv_eps, unbiased=o.adv_unbiased_std,
                          singleton=o.adv_singleton)
    if not o.step_groups:
        return adv, adv.total
    steps = step_group_advantages(rewards, sc["prompt"], [chain_states(t) for t in trees], eps=o.adv_eps,
                                  unbiased=o.adv_unbiased_std, singleton=o.adv_singleton)
    return adv, combine_step_advantages(adv.total, steps, o.step_groups)


def check_replaceable(cfg: Any, loss: bool) -> None:
    """ConfigError unless the config's advantage (and, with `loss`, its loss) is the plain Eq. 7 (Eq. 8) that a
    `Trainer.advantage_fn` (`loss_fn`) replaces, naming the fields that differ."""
    o = cfg.optim
    off = {"optim.advantage": o.advantage != "intra+inter", "optim.step_groups": bool(o.step_groups),
           "optim.adv_eps": o.adv_eps != 1e-6, "optim.adv_unbiased_std": not o.adv_unbiased_std,
           "optim.adv_singleton": o.adv_singleton != "zero"}
    if loss:
        off.update({"optim.loss_agg": o.loss_agg != "seq-mean", "optim.clip_low/clip_high": o.clip_low != o.clip_high,
                    "optim.dual_clip": o.dual_clip != 0, "optim.entropy_coef": o.entropy_coef != 0,
                    "optim.ratio": o.ratio != "token", "optim.kl_beta": o.kl_beta <= 0})
    if any(off.values()):
        raise ConfigError(f"a replaced advantage or loss computes Eq. 7-8 as the paper states them; set "
                          f"{', '.join(k for k, v in off.items() if v)} to the defaults (intra+inter, no step groups, "
                          "eps 1e-6, n - 1 std, groups of one 0; seq-mean, one clip, no dual clip or entropy, token "
                          "ratio, kl_beta > 0)")


@dataclass
class Rows:
    """Training rows, right-padded: ids, attention and policy masks [R, T]; advantages [R], or [R, T] per token."""

    ids: torch.Tensor
    attn: torch.Tensor
    mask: torch.Tensor
    adv: torch.Tensor
    question: list[int]
    tree: list[int]
    """The index of each row's tree in the batch (rows of one tree share prefixes)."""


def build_rows(trees: Sequence[Tree], adv: torch.Tensor, pad_id: int) -> Rows:
    """One row per leaf, in the order of `leaf_rewards`: the exact sampled ids and observation mask.

    `adv` is [R] (one advantage per trajectory) or [R, K] (one per step, step groups): then every token
    of step k of row r takes adv[r, k] (its observation tokens too, which the mask leaves out)."""
    trajs = [t.trajectory(leaf) for t in trees for leaf in t.leaves()]
    width = max(len(x.ids) for x in trajs)
    ids = torch.full((len(trajs), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    per_token = torch.zeros(ids.shape, dtype=adv.dtype) if adv.dim() == 2 else None
    for i, x in enumerate(trajs):
        ids[i, :len(x.ids)] = torch.tensor(x.ids)
        attn[i, :len(x.ids)] = 1
        mask[i, :len(x.ids)] = torch.tensor(x.mask)
        if per_token is not None:
            start = len(x.prompt_ids)
            for k, step in enumerate(x.steps):
                per_token[i, start:start + len(step.ids)] = adv[i, k]
                start += len(step.ids)
    return Rows(ids, attn, mask, (adv if per_token is None else per_token).float(),
                [t.question for t in trees for _ in t.leaves()], [k for k, t in enumerate(trees) for _ in t.leaves()])


@dataclass(frozen=True)
class Micro:
    """One micro-batch's model inputs: its rows' ids and attention [B, width], the sequences the forward
    runs (with optim.pack_trees their trees packed; None: the rows as they are, under the causal kernel) and
    how many leading positions they all share, and where the log-probs are taken: the policy tokens (rows,
    cols) of the [B, width] grid and, for each, the index of the logits that predict it in the forward's
    flattened logits."""

    idx: torch.Tensor
    ids: torch.Tensor
    attn: torch.Tensor
    policy: tuple[torch.Tensor, torch.Tensor]
    at: torch.Tensor
    packed: PackedBatch | None = None
    shared: int = 0


def micro_inputs(rows: Rows, idx: torch.Tensor, pack_trees: bool, share_prefix: bool, pad_id: int) -> Micro:
    """The model inputs of the rows `idx`, built once per update (packing is not free: a trie over ids).

    Log-probs and entropies are taken at the policy tokens only (their logits gathered, then the log-softmax):
    the loss masks every other token, so its value and gradient are those of the whole rows' to the last bit
    (with an entropy bonus, within float rounding: its gradient's terms add in another order; tested in
    tests/test_trainer.py), at a fraction of the [rows, width, vocabulary] work.

    With `pack_trees` each tree's rows run as one sequence along their shared prefixes (tg.packing); with
    `share_prefix` the rows' common start (the prompt's instructions, up to the first logit needed) runs once
    for all of them (tg.packing.packed_logits)."""
    width = int(rows.attn[idx].sum(1).max())
    ids, attn = rows.ids[idx, :width], rows.attn[idx, :width]
    row, col = rows.mask[idx, 1:width].nonzero(as_tuple=True)  # the logits at col predict the token at col + 1
    policy = (row, col + 1)  # position 0 has no predictor (a prompt token)
    shared = common_prefix(ids, int(col.min())) if share_prefix and len(col) else 0
    trees = [rows.tree[int(r)] for r in idx]
    if not pack_trees or len(set(trees)) == len(trees):  # no two rows share a tree: nothing to pack
        packed, at = rows_batch(ids) if shared else None, row * width + col  # into logits [B * width, V]
    else:
        order = sorted(range(len(idx)), key=lambda i: trees[i])  # stable: rows of a tree in order
        groups: dict[int, list[list[int]]] = {}
        for i in order:
            r = int(idx[i])
            groups.setdefault(rows.tree[r], []).append(rows.ids[r, :int(rows.attn[r].sum())].tolist())
        packed = pack_batch(list(groups.values()), width, pad_id)
        unpack = torch.tensor(order).argsort()  # row i of the micro-batch is packed row unpack[i]
        at = packed.where[unpack[row], col]
    if packed is not None:  # the forward's logits leave out each sequence's first `shared` positions
        P = packed.ids.shape[1]
        at = at // P * (P - shared) + at % P - shared
    return Micro(idx, ids, attn, policy, at=at, packed=packed, shared=shared)


def micro_batches(rows: Rows, o: OptimConfig, shards: int, share_prefix: bool, pad_id: int) -> list[list[Micro]]:
    """Micro-batches per PPO mini-batch (consecutive questions of each rollout shard, tg.gpu.distributed).
    Inside a mini-batch the trees go longest first (by their longest row), a tree's rows together, so a
    micro-batch holds rows of like width and little padding; the loss weights make the order immaterial
    up to float summation order."""
    per, mini_per = o.prompts_per_step // shards, o.mini_batch_prompts // shards
    mini = torch.tensor([minibatch_of(q, per, mini_per) for q in rows.question])
    longest: dict[int, int] = {}
    for t, n in zip(rows.tree, rows.attn.sum(1).tolist()):
        longest[t] = max(longest.get(t, 0), n)
    out = []
    for b in range(int(mini.max()) + 1):
        idx = torch.nonzero(mini == b).flatten().tolist()
        idx = torch.tensor(sorted(idx, key=lambda r: (-longest[rows.tree[r]], rows.tree[r], r)), dtype=torch.long)
        out.append([micro_inputs(rows, i, o.pack_trees, share_prefix, pad_id) for i in idx.split(o.micro_batch_rows)])
    return out
