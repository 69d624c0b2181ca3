"""Tree-GRPO in verl (0.9.1): the estimator, the tree index, and the tree rollout as an agent loop (arXiv 2509.21240).

Importing this module registers two names with verl:

    algorithm.adv_estimator=tree_grpo                     `compute_tree_grpo_advantage` (Eq. 6-7)
    agent_name tree_grpo_agent                            `TreeAgentLoop` (Algorithm 1, one tree a session)

and `TreeAgentLoopManager` is the class that `actor_rollout_ref.rollout.agent.agent_loop_manager_class`
names (docs/verl.md has the whole launch command). Naming the manager imports this module in verl's
processes, so both registrations happen wherever verl needs them.

How the pieces fit verl's V1 trainer (`trainer.use_v1=True`):
1. Every prompt runs `actor_rollout_ref.rollout.n` = M sessions of the agent loop; each session grows one tree
   (`grow_tree`: a seed chain, then L rounds of N expansions) and returns its 1 + L N leaves as outputs.
2. A custom estimator receives only the token-level rewards, the response mask and the group index (`uid`),
   so the tree travels in the index: the worker hook (`TreeAgentLoopWorker`) stores each leaf as a session of
   its own (verl then scores every leaf alone) and rewrites its `uid` to `tree_index(uid, tree)` =
   'prompt_uid|tree_id'. The estimator parses it back (`parse_tree_index`) and calls `tg.advantage`.
3. Every leaf's scalar advantage is broadcast over its response mask, as verl's own GRPO estimator does.

Options, one section `algorithm.tree_grpo` (`TreeGRPOOptions`; a key verl does not know is added with `+`).

Deviations from the paper / the official code (numbered):
1. A tree is a session of verl's agent loop, so trees of one prompt grow concurrently and each expansion is a
   separate request with the full root-to-node context; prefix reuse is left to the rollout server's prefix
   cache (one sticky request id per tree keeps a tree's requests on one server).
2. A group of one gets 0 (`singleton='zero'`, `tg.advantage`'s default), so a one-leaf tree's intra-tree term
   is 0 and `tree_grpo` on chains equals verl's `grpo`; 'raw' is the official code's R / (1 + eps).
3. `algorithm.norm_adv_by_std_in_grpo=False` (Dr.GRPO's mean-only advantage) is refused: the paper divides by
   the std (Eq. 6).
4. Validation grows the tree too (the agent loop is not told it is validating); only the seed chain, sampled
   with verl's validation settings, is stored and scored, so the expansions' compute is spent for nothing.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, fields
from typing import Any, Awaitable, Callable, Mapping, Sequence
from uuid import uuid4

import numpy as np
import ray
import torch
import transfer_queue as tq
from torch import Tensor
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.trainer.ppo.core_algos import register_adv_est
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from tg.advantage import tree_grpo
from tg.agent.calculator import CalculatorEnv
from tg.agent.env import Environment, SearchEnv
from tg.agent.protocol import STOP_STRINGS, Step
from tg.config_values import ConfigError
from tg.engines.engine import GenOut
from tg.tree import NODE_RULES, Tree, choose_nodes

ESTIMATOR = "tree_grpo"
AGENT_LOOP = "tree_grpo_agent"
SEP = "|"
MODES = ("intra", "inter", "intra+inter")


@dataclass(frozen=True)
class TreeGRPOOptions:
    """`algorithm.tree_grpo`: the estimator's options (first group) and the tree rollout's (second)."""

    mode: str = "intra+inter"
    """'intra', 'inter' or 'intra+inter' = A_intra + A_inter (Eq. 7), the paper's Tree-GRPO."""
    singleton: str = "zero"
    """A group of one gets 'zero' or 'raw' = R / (1 + eps) (deviation 2)."""
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
    """Per-step generation cap; a leaf's whole response is also capped by rollout.response_length."""


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


def tree_index(prompt_uid: str, tree_id: int | str) -> str:
    """The group index of one leaf: 'prompt_uid|tree_id' (verl's `uid` carries only the prompt)."""
    return f"{prompt_uid}{SEP}{tree_id}"


def parse_tree_index(index: Sequence[str]) -> tuple[Tensor, Tensor]:
    """'prompt_uid|tree_id' strings -> (prompt_ids [G], tree_ids [G]) long codes in order of first appearance.

    The split is at the last '|', so a prompt uid may itself contain '|'.
    """
    prompts: dict[str, int] = {}
    trees: dict[tuple[str, str], int] = {}
    p_ids, t_ids = [], []
    for entry in index:
        prompt, sep, tree = str(entry).rpartition(SEP)
        if not sep:
            raise ValueError(f"index entry {entry!r} is not 'prompt_uid{SEP}tree_id': run the tree rollout "
                             f"(actor_rollout_ref.rollout.agent.agent_loop_manager_class="
                             f"{__name__}.TreeAgentLoopManager), which writes it")
        p_ids.append(prompts.setdefault(prompt, len(prompts)))
        t_ids.append(trees.setdefault((prompt, tree), len(trees)))
    return torch.tensor(p_ids, dtype=torch.long), torch.tensor(t_ids, dtype=torch.long)


@register_adv_est(ESTIMATOR)
def compute_tree_grpo_advantage(token_level_rewards: Tensor, response_mask: Tensor, index: np.ndarray,
                                epsilon: float = 1e-6, config: Mapping[str, Any] | None = None,
                                **kwargs: Any) -> tuple[Tensor, Tensor]:
    """Tree-GRPO's advantage as a verl estimator: `tg.advantage.tree_grpo` per leaf, broadcast over its tokens.

    Args:
        token_level_rewards: [B, T] float; a leaf's outcome reward is its row sum (verl puts it on the last token).
        response_mask: [B, T] 0/1, the policy's own tokens.
        index: [B] 'prompt_uid|tree_id' strings (`tree_index`).
        epsilon: added to each group's std (verl's grpo default 1e-6).
        config: verl's algorithm config; its `tree_grpo` section gives `TreeGRPOOptions`.
        kwargs: what verl passes to other estimators (e.g. reward_baselines); unused.
    Returns:
        (advantages, returns), both [B, T] = the leaf's scalar times its response mask, as verl's grpo.
    """
    opts = tree_options(config)
    scores = token_level_rewards.sum(dim=-1)                                              # [B]
    prompt_ids, tree_ids = parse_tree_index(index)
    adv = tree_grpo(scores, tree_ids, prompt_ids, opts.mode, eps=epsilon, unbiased=opts.unbiased,
                    singleton=opts.singleton)                                             # [B]
    adv = adv.unsqueeze(-1) * response_mask                                               # [B, T]
    return adv, adv


StepFn = Callable[[list[int], int], Awaitable[Step]]
"""(context token ids, steps already taken) -> the next `Step`, its observation included."""


async def run_chain(step: StepFn, context: list[int], turns: int) -> list[Step]:
    """Steps from `context` until one ends the episode (the environment ends it by `max_turns` at the latest)."""
    steps: list[Step] = []
    while not steps or not steps[-1].ends_episode:
        steps.append(await step(context + [t for s in steps for t in s.ids], turns + len(steps)))
    return steps


async def grow_tree(step: StepFn, prompt_ids: list[int], *, N: int, L: int, rng: random.Random,
                    node_rule: str = "paper") -> Tree:
    """One tree by initialize-then-expand (Algorithm 1 of arXiv 2509.21240): a seed chain, then L rounds
    that each continue N chosen nodes (`tg.tree.choose_nodes`) concurrently to the end of their episodes.

    A branch from node v continues v's full root-to-node context with v.depth turns already taken, so the
    tool-call cap counts the shared prefix. The tree has 1 + L N leaves.
    """
    tree = Tree(0, list(prompt_ids))
    tree.add_path(0, await run_chain(step, tree.context(0), 0))
    for _ in range(L):
        nodes = choose_nodes(tree, N, node_rule, rng)
        chains = await asyncio.gather(*(run_chain(step, tree.context(v), tree.nodes[v].depth) for v in nodes))
        for v, chain in zip(nodes, chains):
            tree.add_path(v, chain)
    return tree


def leaf_order(tree: Tree) -> list[int]:
    """The tree's leaves with the seed chain's leaf last (verl's validation keeps a session's last output)."""
    leaves = tree.leaves()
    seed = min(leaves)                                        # the seed chain is added first: its leaf is smallest
    return [leaf for leaf in leaves if leaf != seed] + [seed]


def make_environment(opts: TreeGRPOOptions, tokenizer: Any) -> Environment:
    """The rollout's tool on verl's tokenizer: the kit's `SearchEnv` (HTTP retriever) or `CalculatorEnv`."""
    if opts.env == "calculator":
        return CalculatorEnv(tokenizer, max_obs_tokens=opts.max_obs_tokens, max_turns=opts.max_turns)
    from tg.agent.server import HTTPRetriever  # only the search task needs the retrieval client
    return SearchEnv(tokenizer, HTTPRetriever(opts.retriever_url), top_k=opts.top_k,
                     max_obs_tokens=opts.max_obs_tokens, max_turns=opts.max_turns)


def finish_reason(ids: Sequence[int], text: str, eos_ids: Sequence[int]) -> str:
    """`GenOut.finish` of a step a verl server returned: 'eos', 'stop' (closed a stop string) or 'length'."""
    if ids and ids[-1] in eos_ids:
        return "eos"
    return "stop" if text.rstrip().endswith(STOP_STRINGS) else "length"


@register(AGENT_LOOP)
class TreeAgentLoop(AgentLoopBase):
    """One session = one tree (`grow_tree`) on verl's rollout servers; returns its leaves, seed chain last.

    Each step is one `server_manager.generate` call on the exact token ids of the node's context, stopped at
    `tg.agent.protocol.STOP_STRINGS`; the kit's environment parses the action and appends the observation ids.
    All calls of a tree share one sticky request id, so they reach one server and its prefix cache.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opts = tree_options(self.config.algorithm)
        self.env = make_environment(self.opts, self.tokenizer)
        eos = self.tokenizer.eos_token_id
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [])

    async def step(self, context: list[int], turns: int, *, sampling_params: dict[str, Any], request_id: str) -> Step:
        """One agent step from `context`: the server's sampled ids, then the environment's observation."""
        room = self.rollout_config.prompt_length + self.rollout_config.response_length - len(context)
        params = {**sampling_params, "stop": list(STOP_STRINGS), "include_stop_str_in_output": True,
                  "max_tokens": max(1, min(self.opts.max_step_tokens, room))}
        out = await self.server_manager.generate(request_id=request_id, prompt_ids=context, sampling_params=params)
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=False)
        gen = GenOut(list(out.token_ids), list(out.log_probs or []), finish_reason(out.token_ids, text, self.eos_ids))
        return self.env.observe([gen], [turns])[0]

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        request_id = uuid4().hex

        async def step(context: list[int], turns: int) -> Step:
            return await self.step(context, turns, sampling_params=sampling_params, request_id=request_id)

        tree = await grow_tree(step, prompt_ids, N=self.opts.N, L=self.opts.L, rng=random.Random(request_id),
                               node_rule=self.opts.node_rule)
        return [self.leaf_output(tree, leaf) for leaf in leaf_order(tree)]

    def leaf_output(self, tree: Tree, leaf: int) -> AgentLoopOutput:
        """A root-to-leaf path as verl's output: response = the steps' ids, mask 0 on observation ids."""
        traj, cap = tree.trajectory(leaf), self.rollout_config.response_length
        logprobs = None
        if all(s.logprobs and len(s.logprobs) == len(s.gen_ids) for s in traj.steps):   # the server reported them
            logprobs = [x for s in traj.steps for x in s.logprobs + [0.0] * len(s.obs_ids)][:cap]
        return AgentLoopOutput(prompt_ids=traj.prompt_ids, response_ids=traj.response_ids[:cap],
                               response_mask=traj.response_mask[:cap], response_logprobs=logprobs,
                               num_turns=2 * len(traj.steps), metrics=AgentLoopMetrics(),
                               extra_fields={"tree_leaf": leaf})


def leaf_session(tree: int, leaf: int, leaves_per_tree: int) -> int:
    """The session id a leaf is stored under: every leaf its own session, so verl scores each one on its own
    (verl scores only the last output of a multi-output session and copies that reward to the others)."""
    return tree * leaves_per_tree + leaf


class TreeAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's TransferQueue agent-loop worker, with a tree's leaves stored the way Tree-GRPO needs them.

    Key '{uid}_{leaf_session}_0' per leaf (the replay buffer groups keys by the prompt uid before the first
    '_'), then the leaf's `uid` field rewritten to `tree_index(uid, tree)`, the index the estimator groups by.
    In validation only the seed chain (the last leaf) is stored.
    """

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> None:
        if not (isinstance(output, list) and output and "tree_leaf" in output[0].extra_fields):
            return await super()._agent_loop_postprocess(output, validate, **kwargs)
        uid, tree = kwargs["uid"], int(kwargs["session_id"])
        leaves = output[-1:] if validate else output
        sessions = [leaf_session(tree, j, len(output)) for j in range(len(leaves))]
        for leaf, session in zip(leaves, sessions):
            await super()._agent_loop_postprocess(leaf, validate, **{**kwargs, "session_id": session})
        rows = list_of_dict_to_tensordict([{"uid": tree_index(uid, tree)} for _ in sessions])
        await tq.async_kv_batch_put(keys=[f"{uid}_{s}_0" for s in sessions], fields=rows,
                                    partition_id="val" if validate else "train")


class TreeAgentLoopManager(AgentLoopManagerTQ):
    """`actor_rollout_ref.rollout.agent.agent_loop_manager_class`: verl's manager with `TreeAgentLoopWorker`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(TreeAgentLoopWorker)
