"""Tree-GRPO in verl (0.9.1): the estimator, the tree rollout as an agent loop, and its trainer (arXiv 2509.21240).

Importing this module registers three names with verl:

    algorithm.adv_estimator=tree_grpo                     `compute_tree_grpo_advantage` (Eq. 6-7)
    agent_name tree_grpo_agent                            `TreeAgentLoop` (Algorithm 1, one tree a session)
    trainer.v1.trainer_mode=tree_grpo_sync                `TreeTrainer` (verl's sync trainer + the tree counts)

`TreeAgentLoopManager` is the class that `actor_rollout_ref.rollout.agent.agent_loop_manager_class` names, and
`setup_worker` the Ray hook (`ray_kwargs.ray_init.runtime_env.worker_process_setup_hook`) that imports this
module in every Ray process, so all three registrations happen before verl looks them up (docs/verl.md has
the whole launch command).

How the pieces fit verl's V1 trainer (`trainer.use_v1=True`):
1. Every prompt runs `actor_rollout_ref.rollout.n` = M sessions of the agent loop; each session grows one tree
   (`grow_tree`: a seed chain, then L rounds of N expansions) and returns its 1 + L N leaves as outputs.
2. A custom estimator receives only the token-level rewards, the response mask and the group index (`uid`),
   so the tree travels in the index: the worker hook (`TreeAgentLoopWorker`) stores each leaf as a session of
   its own (verl then scores every leaf alone) and rewrites its `uid` to `tree_index(uid, tree)` =
   'prompt_uid|tree_id'. The estimator parses it back (`parse_tree_index`) and calls `tg.advantage`.
3. Every leaf's scalar advantage is broadcast over its response mask, as verl's own GRPO estimator does.
4. Rows outside a tree (verl's padding), failed trees and the response cap follow the rules of
   `tg.integrations.verl_options` (numbered there); `TreeTrainer` logs their counts each step.

Options, one section `algorithm.tree_grpo` (`TreeGRPOOptions`; a key verl does not know is added with `+`).

Deviations from the paper / the official code (numbered):
1. A tree is a session of verl's agent loop, so trees of one prompt grow concurrently and each expansion is a
   separate request with the full root-to-node context; prefix reuse is left to the rollout server's prefix
   cache (one sticky request id per tree keeps a tree's requests on one server).
2. A group of one gets 0 (`singleton='zero'`, `tg.advantage`'s default), so a one-leaf tree's intra-tree term
   is 0 and `tree_grpo` on chains equals verl's `grpo`; 'raw' is the official code's R / (1 + eps).
3. `algorithm.norm_adv_by_std_in_grpo=False` (Dr.GRPO's mean-only advantage) is refused: the paper divides by
   the std (Eq. 6).
4. Validation samples one chain per session (no expansion) with verl's validation settings and keeps the
   prompt's `uid`, so verl reports it per prompt.
"""

from __future__ import annotations

import asyncio
import random
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any, Awaitable, Callable, Mapping, Sequence
from uuid import uuid4

import numpy as np
import ray
import transfer_queue as tq
from torch import Tensor
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.trainer.ppo.core_algos import register_adv_est
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from tg.advantage import tree_grpo
from tg.agent.calculator import CalculatorEnv
from tg.agent.env import Environment, SearchEnv
from tg.agent.protocol import STOP_STRINGS, Step
from tg.engines.engine import GenOut
from tg.integrations.verl_options import (AGENT_LOOP, ESTIMATOR, MODES, SEP, TRAINER, TreeGRPOOptions,  # noqa: F401
                                          check_engine, parse_tree_index, response_budget, tree_index,
                                          tree_options, tree_step_metrics)
from tg.tree import Tree, choose_nodes

RETRIEVAL_THREADS = 64
"""Threads a worker process runs environment calls on (each search is one blocking HTTP request)."""


@register_adv_est(ESTIMATOR)
def compute_tree_grpo_advantage(token_level_rewards: Tensor, response_mask: Tensor, index: np.ndarray,
                                epsilon: float = 1e-6, config: Mapping[str, Any] | None = None,
                                **kwargs: Any) -> tuple[Tensor, Tensor]:
    """Tree-GRPO's advantage as a verl estimator: `tg.advantage.tree_grpo` per leaf, broadcast over its tokens.

    Args:
        token_level_rewards: [B, T] float; a leaf's outcome reward is its row sum (verl puts it on the last token).
        response_mask: [B, T] 0/1, the policy's own tokens.
        index: [B] 'prompt_uid|tree_id' strings (`tree_index`); a row without '|' is outside every tree and gets
            0 (verl_options rule 1).
        epsilon: added to each group's std (verl's grpo default 1e-6).
        config: verl's algorithm config; its `tree_grpo` section gives `TreeGRPOOptions`.
        kwargs: what verl passes to other estimators (e.g. reward_baselines); unused.
    Returns:
        (advantages, returns), both [B, T] = the leaf's scalar times its response mask, as verl's grpo.
    """
    opts = tree_options(config)
    scores = token_level_rewards.sum(dim=-1)                                              # [B]
    prompt_ids, tree_ids, in_tree = parse_tree_index(index)
    adv = tree_grpo(scores, tree_ids, prompt_ids, opts.mode, eps=epsilon, unbiased=opts.unbiased,
                    singleton=opts.singleton)                                             # [B]
    adv = (adv * in_tree).unsqueeze(-1) * response_mask                                   # [B, T]
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


def fit_response(step: Step, room: int) -> Step:
    """The step within the `room` response tokens left (verl_options rule 3): a step that fills it ends the
    episode, its observation cut to fit. The step's generated ids already fit (max_tokens <= room)."""
    if step.ends_episode or len(step.ids) < room:
        return step
    step.obs_ids, step.ends_episode = step.obs_ids[:room - len(step.gen_ids)], True
    return step


@cache
def retrieval_pool() -> ThreadPoolExecutor:
    """The process's threads for environment calls, so a blocking search never stalls the event loop."""
    return ThreadPoolExecutor(RETRIEVAL_THREADS, thread_name_prefix="tg-env")


@register(AGENT_LOOP)
class TreeAgentLoop(AgentLoopBase):
    """One session = one tree (`grow_tree`) on verl's rollout servers; returns its leaves, seed chain last.

    Each step is one `server_manager.generate` call on the exact token ids of the node's context, stopped at
    `tg.agent.protocol.STOP_STRINGS`; the kit's environment parses the action and appends the observation ids,
    on `retrieval_pool` (off the event loop). All calls of a tree share one sticky request id, so they reach one
    server and its prefix cache. A leaf's response stays within rollout.response_length (`fit_response`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        check_engine(self.rollout_config.name)
        self.opts = tree_options(self.config.algorithm)
        self.env = make_environment(self.opts, self.tokenizer)
        eos = self.tokenizer.eos_token_id
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [])

    async def step(self, context: list[int], turns: int, room: int, *, sampling_params: dict[str, Any],
                   request_id: str) -> Step:
        """One agent step from `context` with `room` response tokens left: the server's sampled ids, then the
        environment's observation."""
        params = {**sampling_params, "stop": list(STOP_STRINGS), "include_stop_str_in_output": True,
                  "max_tokens": min(self.opts.max_step_tokens, room)}
        out = await self.server_manager.generate(request_id=request_id, prompt_ids=context, sampling_params=params)
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=False)
        gen = GenOut(list(out.token_ids), list(out.log_probs or []), finish_reason(out.token_ids, text, self.eos_ids))
        steps = await asyncio.get_running_loop().run_in_executor(retrieval_pool(), self.env.observe, [gen], [turns])
        return fit_response(steps[0], room)

    async def run(self, sampling_params: dict[str, Any], *, tree_chain: bool = False,
                  **kwargs: Any) -> list[AgentLoopOutput]:
        """The tree's leaves (seed chain last); with `tree_chain` (validation) the seed chain alone."""
        prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        request_id, cap = uuid4().hex, self.rollout_config.response_length

        async def step(context: list[int], turns: int) -> Step:
            room = cap - (len(context) - len(prompt_ids))
            return await self.step(context, turns, room, sampling_params=sampling_params, request_id=request_id)

        tree = await grow_tree(step, prompt_ids, N=self.opts.N, L=0 if tree_chain else self.opts.L,
                               rng=random.Random(request_id), node_rule=self.opts.node_rule)
        return [self.leaf_output(tree, leaf) for leaf in leaf_order(tree)]

    def leaf_output(self, tree: Tree, leaf: int) -> AgentLoopOutput:
        """A root-to-leaf path as verl's output: response = the steps' ids, mask 0 on observation ids."""
        traj = tree.trajectory(leaf)
        logprobs = None
        if all(s.logprobs and len(s.logprobs) == len(s.gen_ids) for s in traj.steps):   # the server reported them
            logprobs = [x for s in traj.steps for x in s.logprobs + [0.0] * len(s.obs_ids)]
        truncated = len(traj.response_ids) >= self.rollout_config.response_length
        return AgentLoopOutput(prompt_ids=traj.prompt_ids, response_ids=traj.response_ids,
                               response_mask=traj.response_mask, response_logprobs=logprobs,
                               num_turns=2 * len(traj.steps), metrics=AgentLoopMetrics(),
                               extra_fields={"tree_leaf": leaf, "tree_truncated": truncated})


def leaf_session(tree: int, leaf: int, leaves_per_tree: int) -> int:
    """The session id a leaf is stored under: every leaf its own session, so verl scores each one on its own
    (verl scores only the last output of a multi-output session and copies that reward to the others)."""
    return tree * leaves_per_tree + leaf


class TreeAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's TransferQueue agent-loop worker, with a tree's leaves stored the way Tree-GRPO needs them.

    Training: key '{uid}_{leaf_session}_0' per leaf (the replay buffer groups keys by the prompt uid before the
    first '_'), then the leaf's `uid` field rewritten to `tree_index(uid, tree)`, the index the estimator groups
    by. Validation: the agent loop samples one chain (`tree_chain`), stored as verl stores any session, under
    the prompt's `uid`.
    """

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], *,
                              agent_name: str, trace: bool = True, **kwargs: Any) -> Any:
        return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, trace=trace,
                                             tree_chain=bool(trajectory["validate"]), **kwargs)

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> None:
        kwargs.pop("tree_chain", None)
        if validate or not (isinstance(output, list) and output and "tree_leaf" in output[0].extra_fields):
            return await super()._agent_loop_postprocess(output, validate, **kwargs)
        uid, tree = kwargs["uid"], int(kwargs["session_id"])
        sessions = [leaf_session(tree, j, len(output)) for j in range(len(output))]
        for leaf, session in zip(output, sessions):
            await super()._agent_loop_postprocess(leaf, validate, **{**kwargs, "session_id": session})
        rows = list_of_dict_to_tensordict([{"uid": tree_index(uid, tree)} for _ in sessions])
        await tq.async_kv_batch_put(keys=[f"{uid}_{s}_0" for s in sessions], fields=rows, partition_id="train")


class TreeAgentLoopManager(AgentLoopManagerTQ):
    """`actor_rollout_ref.rollout.agent.agent_loop_manager_class`: verl's manager with `TreeAgentLoopWorker`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(TreeAgentLoopWorker)


@register_trainer(TRAINER)
class TreeTrainer(PPOTrainerSync):
    """verl's sync trainer that logs the step's tree counts (`tree_step_metrics`) after the advantage."""

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        batch = super()._compute_advantage(batch, metrics)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["uid", "extra_fields"])
        extra = [e if isinstance(e, dict) else {} for e in data.pop("extra_fields").tolist()]  # as verl reads them
        opts = tree_options(self.config.algorithm)
        metrics.update(tree_step_metrics(data.pop("uid").tolist(), [t.get("is_padding", False) for t in batch.tags],
                                         [e.get("tree_truncated", False) for e in extra],
                                         self.config.actor_rollout_ref.rollout.n, 1 + opts.L * opts.N))
        return batch


def setup_worker() -> None:
    """Ray's `worker_process_setup_hook`: importing this module has registered the estimator, the agent loop and
    the trainer in the process, which is all the hook is for."""
