"""Tree-GRPO's options, group index and step counts in verl, apart from verl itself (arXiv 2509.21240).

`tg.integrations.verl` wires these into verl's estimator, agent loop and trainer; this module imports neither
verl nor Ray, so its rules read (and test) on their own:

1. The group index: verl's `uid` carries only the prompt, so each leaf's is rewritten to 'prompt_uid|tree_id'
   (`tree_index`). A row whose `uid` has no '|' is not part of a tree: verl's padding rows ('pad...'), or the
   leaves of a tree whose storage failed half-way. Each such uid is a group of its own and its advantage is 0.
2. A failed tree (its session raised, e.g. a retriever timeout) stores no leaves and is dropped: its prompt's
   other trees keep their leaves, and A_inter is taken over the leaves that exist.
3. The response budget: a leaf's response holds at most max_turns + 1 steps of max_step_tokens and max_turns
   observations of max_obs_tokens (`response_budget`); `data.max_response_length` set to it cuts no leaf.
   A smaller cap ends a leaf where its response fills the cap (its last observation cut to fit), as the kit's
   rollout ends a row at agent.max_context_tokens; the leaf is scored as it stands and counted as truncated.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from tg.config_values import ConfigError
from tg.tree import NODE_RULES

ESTIMATOR = "tree_grpo"
AGENT_LOOP = "tree_grpo_agent"
TRAINER = "tree_grpo_sync"
SEP = "|"
MODES = ("intra", "inter", "intra+inter")
ENGINES = ("vllm",)
"""Rollout servers the agent loop supports: each step stops at '</search>' / '</answer>' and keeps the stop
string in its ids (vLLM's `include_stop_str_in_output`); SGLang takes other sampling keys and is refused."""


@dataclass(frozen=True)
class TreeGRPOOptions:
    """`algorithm.tree_grpo`: the estimator's options (first group) and the tree rollout's (second)."""

    mode: str = "intra+inter"
    """'intra', 'inter' or 'intra+inter' = A_intra + A_inter (Eq. 7), the paper's Tree-GRPO."""
    singleton: str = "zero"
    """A group of one gets 'zero' or 'raw' = R / (1 + eps) (deviation 2 of tg.integrations.verl)."""
    unbiased: bool = True
    """n-1 std (torch.std, as verl's grpo and the official code) or n."""
    N: int = 2
    """Nodes expanded per tree per round (the paper's N); M is actor_rollout_ref.rollout.n."""
    L: int = 1
    """Expansion rounds (the paper's L); a tree has 1 + L N leaves."""
    node_rule: str = "paper"
    """Node choice: 'paper', 'official' or 'entropy' (`tg.tree.NODE_RULES`; 'entropy' needs entropies,
    which verl's servers do not report: every node scores 0 and the earliest N are chosen)."""
    env: str = "search"
    """'search' (`SearchEnv` on an HTTP retriever at `retriever_url`) or 'calculator'."""
    retriever_url: str = "http://127.0.0.1:8000/retrieve"
    top_k: int = 3
    """Documents per search (the paper's top-k)."""
    max_turns: int = 3
    """Tool calls before the forced final step (the paper's max tool calls)."""
    max_obs_tokens: int = 500
    max_step_tokens: int = 500
    """Per-step generation cap; a leaf's whole response is capped by rollout.response_length (rule 3)."""


def tree_options(config: Mapping[str, Any] | None) -> TreeGRPOOptions:
    """`TreeGRPOOptions` from verl's algorithm config (its `tree_grpo` section; defaults where absent)."""
    config = config or {}
    if not config.get("norm_adv_by_std_in_grpo", True):
        raise ConfigError("algorithm.norm_adv_by_std_in_grpo=False is not Tree-GRPO (Eq. 6 divides by the std); "
                          "set it to True")
    section = dict(config.get("tree_grpo") or {})
    known = {f.name for f in fields(TreeGRPOOptions)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError(f"algorithm.tree_grpo has unknown keys {unknown}; known: {sorted(known)}")
    opts = TreeGRPOOptions(**section)
    if opts.mode not in MODES:
        raise ConfigError(f"algorithm.tree_grpo.mode must be one of {MODES}, got {opts.mode!r}")
    if opts.node_rule not in NODE_RULES:
        raise ConfigError(f"algorithm.tree_grpo.node_rule must be one of {tuple(NODE_RULES)}, got {opts.node_rule!r}")
    if opts.env not in ("search", "calculator"):
        raise ConfigError(f"algorithm.tree_grpo.env must be 'search' or 'calculator', got {opts.env!r}")
    if opts.N < 0 or opts.L < 0:
        raise ConfigError(f"algorithm.tree_grpo.N and .L must be >= 0, got N={opts.N}, L={opts.L}")
    return opts


def check_engine(name: str) -> None:
    """Refuse a rollout server the tree agent loop does not support (`ENGINES`), in one line."""
    if name not in ENGINES:
        raise ConfigError(f"actor_rollout_ref.rollout.name={name}: the tree agent loop runs on {ENGINES} only (its "
                          "steps use vLLM's stop strings and include_stop_str_in_output); set rollout.name=vllm")


def response_budget(opts: TreeGRPOOptions) -> int:
    """The longest response a leaf can hold (rule 3): (max_turns + 1) steps and max_turns observations."""
    return (opts.max_turns + 1) * opts.max_step_tokens + opts.max_turns * opts.max_obs_tokens


def tree_index(prompt_uid: str, tree_id: int | str) -> str:
    """The group index of one leaf: 'prompt_uid|tree_id' (verl's `uid` carries only the prompt)."""
    return f"{prompt_uid}{SEP}{tree_id}"


def parse_tree_index(index: Sequence[str]) -> tuple[Tensor, Tensor, Tensor]:
    """'prompt_uid|tree_id' strings -> (prompt_ids [G], tree_ids [G], in_tree [G] bool), codes in order of first
    appearance. The split is at the last '|', so a prompt uid may itself contain '|'.

    An entry without '|' is not in a tree (rule 1): its uid is a prompt and a tree of its own, in_tree False.
    Raises if no entry is in a tree: the tree rollout, which writes the index, did not run.
    """
    prompts: dict[tuple[str, bool], int] = {}
    trees: dict[tuple[str, bool, str], int] = {}
    p_ids, t_ids, in_tree = [], [], []
    for entry in index:
        prompt, sep, tree = str(entry).rpartition(SEP)
        if not sep:                    # apart from the trees of a prompt with the same uid
            prompt = tree = str(entry)
        p_ids.append(prompts.setdefault((prompt, bool(sep)), len(prompts)))
        t_ids.append(trees.setdefault((prompt, bool(sep), tree), len(trees)))
        in_tree.append(bool(sep))
    if len(in_tree) and not any(in_tree):
        raise ValueError(f"no index entry is 'prompt_uid{SEP}tree_id' (first: {index[0]!r}): run the tree rollout "
                         "(actor_rollout_ref.rollout.agent.agent_loop_manager_class="
                         "tg.integrations.verl.TreeAgentLoopManager), which writes it")
    return (torch.tensor(p_ids, dtype=torch.long), torch.tensor(t_ids, dtype=torch.long),
            torch.tensor(in_tree, dtype=torch.bool))


def tree_step_metrics(index: Sequence[str], padding: Sequence[bool], truncated: Sequence[bool],
                      M: int, leaves_per_tree: int) -> dict[str, float]:
    """The step's tree counts, logged beside verl's metrics (names in docs/verl.md#metrics).

    index: [B] the rows' uids; padding: [B] verl's `is_padding` tags; truncated: [B] the leaf filled the response
    cap (rule 3); M: trees per prompt (rollout.n); leaves_per_tree: 1 + L N.
    """
    real = [(u, t) for u, p, t in zip(index, padding, truncated) if not p]
    trees: dict[str, dict[str, int]] = {}
    for uid, _ in real:
        prompt, sep, tree = str(uid).rpartition(SEP)
        if sep:
            per_prompt = trees.setdefault(prompt, {})
            per_prompt[tree] = per_prompt.get(tree, 0) + 1
    return {
        "tree/leaves": float(len(real)),
        "tree/pad_rows": float(sum(bool(p) for p in padding)),
        "tree/rows_outside_trees": float(sum(SEP not in str(u) for u, _ in real)),
        "tree/failed_trees": float(sum(max(M - len(t), 0) for t in trees.values())),
        "tree/partial_trees": float(sum(n < leaves_per_tree for t in trees.values() for n in t.values())),
        "tree/truncated_leaves": float(sum(bool(t) for _, t in real)),
    }
