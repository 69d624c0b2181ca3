"""Group-relative advantages: chain GRPO, intra-tree, inter-tree and their sum (Eq. 5-7, arXiv 2509.21240).

Every trajectory (one leaf of a tree, or one chain) has a scalar outcome reward R(H_i). The
advantage of a trajectory is its reward normalised within a group G of trajectories:

    A(H_i) = (R(H_i) - mean{R(H_j) : j in G}) / (std{R(H_j) : j in G} + eps)       (Eq. 5 / Eq. 6)

- chain GRPO (Eq. 5): G = the trajectories of the same prompt;
- inter-tree (Eq. 6):  G = the leaves of all M trees of the same prompt, M (1 + L N) of them;
- intra-tree (Eq. 6):  G = the leaves of the trajectory's own tree, 1 + L N of them;
- Tree-GRPO  (Eq. 7):  A_tree = A_intra + A_inter, a plain sum, not re-normalised;
- step groups (GiGPO, without trees): G = the steps of a prompt's chains that act from the same state
  (`step_group_advantages`), added to the episode advantage with a weight (`combine_step_advantages`).

The advantage is broadcast to every policy token of the trajectory by the loss (`tg.loss`). A
prefix shared by several leaves appears once per leaf in the batch, so it receives the *sum* of its
descendant leaves' advantages (docs/paper.md#shared-prefixes); `node_advantages` computes that sum for a tree.

Deviations from the paper / the official code (numbered; the config field that selects each):
1. `eps` (optim.adv_eps = 1e-6) is added to the std, as in the official code; the paper has none.
2. `unbiased` (optim.adv_unbiased_std): True = n-1 std as `torch.std` in the official code
   (default); False = the population std. The paper does not say which.
3. A group whose rewards are all equal gets exactly 0 (the code gets 0 because its deviations are
   0; here it is enforced, so float round-off in the mean cannot leak a tiny advantage).
4. `singleton` (optim.adv_singleton): a group of one gets "zero" (default; it carries no relative
   information) or "raw" = the official code's mean 0, std 1, i.e. A = R / (1 + eps).
5. Intra-tree groups are keyed by (prompt id, tree id), so tree ids may be global (the code's
   random `tree_uid`) or numbered within each prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

import torch
from torch import Tensor

MODES = ("chain", "inter", "intra", "intra+inter")
SINGLETON = ("zero", "raw")


def group_relative(rewards: Tensor, group_ids: Tensor, eps: float = 1e-6, unbiased: bool = True,
                   singleton: str = "zero") -> Tensor:
    """(r - mean_g) / (std_g + eps) within each group g (Eq. 5 / Eq. 6 of arXiv 2509.21240).

    Args:
        rewards: [G] float, one scalar outcome reward per trajectory.
        group_ids: [G] long, any integers; equal ids form one group (order does not matter).
        eps: added to the group std (deviation 1 of the module docstring).
        unbiased: n-1 (True, torch.std) or n (False) in the std (deviation 2).
        singleton: a group of one gets "zero" or "raw" = R / (1 + eps) (deviation 4).
    Returns:
        [G] advantages, same dtype as `rewards`; all-equal groups get exactly 0 (deviation 3).
    """
    if singleton not in SINGLETON:
        raise ValueError(f"singleton must be one of {SINGLETON}, got {singleton!r}")
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(f"rewards and group_ids must both be [G], got {tuple(rewards.shape)} and "
                         f"{tuple(group_ids.shape)}")
    _, g = torch.unique(group_ids, return_inverse=True)  # g: [G] group index in 0..n_groups-1
    n_groups = int(g.max()) + 1 if g.numel() else 0
    zeros = rewards.new_zeros(n_groups)
    count = zeros.index_add(0, g, torch.ones_like(rewards))                       # [n_groups]
    mean = zeros.index_add(0, g, rewards) / count                                 # [n_groups]
    dev = rewards - mean[g]                                                       # [G]
    dof = (count - 1).clamp(min=1) if unbiased else count                         # avoid 0/0 for n = 1
    std = (zeros.index_add(0, g, dev * dev) / dof).sqrt()                         # [n_groups]
    adv = dev / (std[g] + eps)
    hi = zeros.scatter_reduce(0, g, rewards, "amax", include_self=False)
    lo = zeros.scatter_reduce(0, g, rewards, "amin", include_self=False)
    adv = torch.where((hi == lo)[g], torch.zeros_like(adv), adv)                  # all-equal -> exactly 0
    if singleton == "raw":  # the official code's group of one: mean 0, std 1
        adv = torch.where(count[g] == 1, rewards / (1.0 + eps), adv)
    return adv


@dataclass(frozen=True)
class TreeAdvantage:
    """The Tree-GRPO advantage and its two parts, each [G]; always total == intra + inter.

    A part the mode does not use is all zeros ("chain" and "inter": intra = 0; "intra": inter = 0).
    The trainer logs both parts (the official code's `critic/{inner,inter}_tree_advantages`).
    """

    total: Tensor
    intra: Tensor
    inter: Tensor


def tree_grpo_parts(rewards: Tensor, tree_ids: Tensor, prompt_ids: Tensor, mode: str = "intra+inter",
                    eps: float = 1e-6, unbiased: bool = True, singleton: str = "zero") -> TreeAdvantage:
    """Intra-tree and inter-tree advantages and their combination (Eq. 6-7 of arXiv 2509.21240).

    Args:
        rewards: [G] float, one reward per leaf trajectory (any order).
        tree_ids: [G] long, the tree of each leaf (global, or numbered within its prompt).
        prompt_ids: [G] long, the prompt of each leaf.
        mode: "chain" = plain GRPO by prompt (Eq. 5); "inter" = by prompt over all trees' leaves;
            "intra" = by tree; "intra+inter" = their plain sum (Eq. 7, the paper's Tree-GRPO).
        eps, unbiased, singleton: as in `group_relative`.
    Returns:
        TreeAdvantage(total, intra, inter), each [G].
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    zero = torch.zeros_like(rewards)
    # "chain" and "inter" are the same computation; they differ in what the rollouts are.
    inter = group_relative(rewards, prompt_ids, eps, unbiased, singleton) if mode != "intra" else zero
    if mode in ("intra", "intra+inter"):
        pairs = torch.stack([prompt_ids.long(), tree_ids.long()], dim=1)              # [G, 2]
        _, tree_key = torch.unique(pairs, dim=0, return_inverse=True)
        intra = group_relative(rewards, tree_key, eps, unbiased, singleton)
    else:
        intra = zero
    return TreeAdvantage(total=intra + inter, intra=intra, inter=inter)


def tree_grpo(rewards: Tensor, tree_ids: Tensor, prompt_ids: Tensor, mode: str = "intra+inter",
              eps: float = 1e-6, unbiased: bool = True, singleton: str = "zero") -> Tensor:
    """The Tree-GRPO advantage A_tree = A_intra + A_inter (Eq. 7); [G]. See `tree_grpo_parts`."""
    return tree_grpo_parts(rewards, tree_ids, prompt_ids, mode, eps, unbiased, singleton).total


def leaves(parents: Sequence[int]) -> list[int]:
    """Leaf nodes (nodes with no children), ascending, of a tree given as a parent array."""
    has_child = set(p for p in parents if p >= 0)
    return [i for i in range(len(parents)) if i not in has_child]


def _check_parents(parents: Sequence[int]) -> None:
    """Raise ValueError unless `parents` is one tree: a single root (-1), every node reaching it."""
    n = len(parents)
    if any(not -1 <= p < n or p == i for i, p in enumerate(parents)) or list(parents).count(-1) != 1:
        raise ValueError(f"parents must have one root (-1) and other nodes' indices, got {list(parents)}")
    for i in range(n):
        node, hops = i, 0
        while node != -1 and hops <= n:
            node, hops = parents[node], hops + 1
        if node != -1:
            raise ValueError(f"parents contains a cycle through node {i}")


def node_advantages(parents: Sequence[int], leaf_advantage: Mapping[int, float] | Tensor) -> list[float]:
    """Each node's effective advantage: the sum of its descendant leaves' advantages (docs/paper.md#shared-prefixes).

    Every leaf is its own training row holding the whole root-to-leaf path, so a token of node v is
    trained once per descendant leaf, each copy with that leaf's advantage: the net push on v is
    their sum (before clipping). A node shared by all leaves of a tree thus gets a net-zero
    intra-tree push; a branch gets |S| (mean_S - mean_tree) / std_tree (a step-level preference).

    Args:
        parents: [n_nodes], parents[i] = index of node i's parent; the root has -1.
        leaf_advantage: {leaf node index: advantage}, or a [n_leaves] tensor in the order of
            `leaves(parents)` (ascending node index).
    Returns:
        [n_nodes] effective advantages as floats (a leaf's own value for a leaf).
    """
    _check_parents(parents)
    leaf_nodes = leaves(parents)
    if isinstance(leaf_advantage, Tensor):
        if leaf_advantage.shape != (len(leaf_nodes),):
            raise ValueError(f"leaf_advantage tensor must be [n_leaves] = [{len(leaf_nodes)}]")
        leaf_advantage = dict(zip(leaf_nodes, leaf_advantage.tolist()))
    if sorted(leaf_advantage) != leaf_nodes:
        raise ValueError(f"leaf_advantage keys {sorted(leaf_advantage)} are not the leaves {leaf_nodes}")
    total = [0.0] * len(parents)
    for leaf, a in leaf_advantage.items():
        node = leaf
        while node != -1:  # walk up to the root, adding the leaf's advantage to every ancestor
            total[node] += float(a)
            node = parents[node]
    return total


def observation_prefixes(observations: Sequence[Hashable]) -> list[tuple[Hashable, ...]]:
    """The state before each step of a chain: step k (0-based) has seen observations[:k].

    A chain of K steps makes K - 1 tool calls, so `observations` holds K - 1 (hashable, e.g. tuples of
    token ids) and the states are (), (o_1,), ..., (o_1, ..., o_{K-1}): K of them.
    """
    return [tuple(observations[:k]) for k in range(len(observations) + 1)]


def step_group_advantages(rewards: Tensor, prompt_ids: Sequence[Hashable], states: Sequence[Sequence[Hashable]],
                          gamma: float = 1.0, eps: float = 1e-6, unbiased: bool = True,
                          singleton: str = "zero") -> Tensor:
    """Step-level group-relative advantages from anchor-state groups across chains (GiGPO, arXiv 2505.10978).

    Step k of chain i acts from state s_ik (the prompt and the observations so far). Every step of
    every chain of the same prompt that acts from the same state joins one step group S(prompt, s):

        R_ik = gamma^(K_i - 1 - k) R(H_i)                  (discounted return; only terminal reward)
        A_step(i, k) = (R_ik - mean{R_jl : (j, l) in S}) / (std{R_jl : (j, l) in S} + eps)

    and GiGPO's advantage is A(i, k) = A_episode(i) + omega A_step(i, k) (`combine_step_advantages`).

    Deviations from GiGPO (numbered):
    1. Rewards are terminal (Eq. 13), so the return is the discounted outcome reward; gamma = 1
       (default) makes it R(H_i) at every step. GiGPO sums discounted per-step rewards.
    2. The normaliser is `group_relative`'s (eps, n-1 std, singleton) as the episode-level one;
       GiGPO also offers a mean-only variant, not here. A singleton state gets 0 by default.
    3. The first state, the prompt alone, is shared by all chains of the prompt: with gamma = 1 its
       step group is the episode group, so step 0 gets A_episode (1 + omega), as in GiGPO.
    4. In the trainer for chains only (`optim.step_groups` = omega; tg.batch.chain_states gives the states).

    Args:
        rewards: [n] float, one outcome reward per chain.
        prompt_ids: [n] hashable prompt keys; states are grouped only within a prompt.
        states: per chain, K_i hashable state keys, one per step (e.g. `observation_prefixes`).
        gamma: discount of the terminal reward per step back from the last.
        eps, unbiased, singleton: as in `group_relative`.
    Returns:
        [n, max K_i] step advantages, same dtype as `rewards`; 0 past a chain's last step.
    """
    if not len(rewards) == len(prompt_ids) == len(states) or rewards.dim() != 1:
        raise ValueError(f"rewards [n], prompt_ids and states must have one entry per chain, got "
                         f"{tuple(rewards.shape)}, {len(prompt_ids)}, {len(states)}")
    keys: dict[tuple[Hashable, Hashable], int] = {}
    where, group, returns = [], [], []                       # one entry per (chain, step)
    for i, (p, chain) in enumerate(zip(prompt_ids, states)):
        for k, s in enumerate(chain):
            where.append((i, k))
            group.append(keys.setdefault((p, s), len(keys)))
            returns.append(rewards[i] * gamma ** (len(chain) - 1 - k))
    out = rewards.new_zeros(len(states), max((len(c) for c in states), default=0))      # [n, K_max]
    if where:
        adv = group_relative(torch.stack(returns), torch.tensor(group), eps, unbiased, singleton)
        rows, cols = zip(*where)
        out[list(rows), list(cols)] = adv
    return out


def combine_step_advantages(episode: Tensor, step: Tensor, omega: float = 1.0) -> Tensor:
    """GiGPO's A(i, k) = A_episode(i) + omega A_step(i, k); episode [n], step [n, K] -> [n, K].

    Every policy token of step k of chain i takes A(i, k) (`policy_loss` accepts [B, T] advantages).
    Positions past a chain's last step hold A_episode(i) and must be masked by the caller.
    """
    return episode[:, None] + omega * step
