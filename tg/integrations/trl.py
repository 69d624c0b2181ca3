"""Tree-GRPO in TRL's `GRPOTrainer` (trl 1.16.0): a tree `rollout_func` and a trainer with the tree advantage.

    rollout = TreeRollout(env, M=2, N=2, L=1)                    # tg trees: M (1 + L N) leaves per prompt
    args = GRPOConfig(output_dir, **grpo_config_kwargs(cfg))      # num_generations = M (1 + L N), Eq. 8's loss
    trainer = TreeGRPOTrainer(model, [tree_reward(make_reward(cfg))], args, rollout_func=rollout,
                              train_dataset=questions_dataset(questions), processing_class=tokenizer)
    trainer.train()

How a tree travels through TRL (arXiv 2509.21240, Algorithm 1 and Eq. 5-8):
1. TRL's sampler repeats each prompt `num_generations` times, contiguously. `TreeRollout` takes each run of
   K = M (1 + L N) copies as one question, grows M trees for it with `tg.tree.sample_trees` and returns its K
   leaves in tree order (tree 0's leaves, then tree 1's, ...; each tree's in `Tree.leaves` order, as `tg`).
2. One leaf is one TRL completion: `prompt_ids` = the prompt (`env.prompt_ids`, chat template included),
   `completion_ids` = the leaf's steps as sampled (policy and observation tokens), `env_mask` = the
   observation mask (1 = policy token, 0 = tool output, so tool output is never trained), `logprobs` = the
   engine's sampling log-probs (0 on observation tokens). Extra fields reach the reward functions:
   `tree_id` (the leaf's tree within its prompt) and `step_texts` (its steps' texts, for a `tg` reward).
3. `TreeGRPOTrainer` lets TRL score the leaves, then replaces TRL's group advantage with
   `tg.advantage.tree_grpo_parts` (A_intra + A_inter, Eq. 7) on the same weighted reward sum, over the
   whole generation batch (all processes) as TRL's own normalisation does.
4. The loss is TRL's; `grpo_config_kwargs` sets it to Eq. 8 (docs/trl.md states which options and why).

Deviations and limits (numbered):
1. A prefix shared by several leaves is trained once per leaf (as `tg` with optim.pack_trees off): the same
   gradient as the packed rows, more compute.
2. Rewards pass through TRL in float32; the advantage is computed from them in float64 (as `tg`'s trainer)
   and handed back in float32.
3. Each process's generation batch must hold whole trees' groups: per_device_train_batch_size x
   steps_per_generation a multiple of K (TRL itself only needs the global batch to be).
4. The rollout samples from the trained model itself (the HF engine) inside TRL's parameter gathering
   (`generation_model`); TRL's vLLM modes (`use_vllm`) and FSDP1 are refused. The HF engine's log-probs are at
   temperature 1 (`GenOut.logprobs`); TRL uses rollout log-probs only for vLLM's importance-sampling correction.
5. Sampling follows TRL's `temperature` and `top_p`, so TRL's log-probs (logits / temperature) are those of
   the distribution sampled from; Eq. 8 as `tg.loss` computes it needs temperature 1 (the paper's).
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from tg.advantage import MODES, TreeAdvantage, tree_grpo_parts
from tg.agent.data import Question
from tg.agent.env import Environment, Reward
from tg.agent.finetune import default_device
from tg.agent.policy import resolve_dtype
from tg.config import Config, ConfigError
from tg.engines.engine import HFEngine, Sampling
from tg.gpu.distributed import shard_seed
from tg.gpu.fsdp import gathered
from tg.tree import Tree, sample_trees
from tg.trainer import rollout_seed

try:
    from accelerate.utils import gather_object
    from trl import GRPOConfig, GRPOTrainer
    from trl.models import unwrap_model_for_generation
except ImportError as err:  # the `bench` extra
    raise ImportError("tg.integrations.trl needs TRL: pip install -e '.[bench]' (trl==1.16.0)") from err

LOSS_TYPES = {"seq-mean": "grpo", "token-mean": "bnpo"}
"""tg's optim.loss_agg -> TRL's loss_type with the same aggregation (tg.loss.masked_aggregate)."""


@dataclass(frozen=True)
class TreeRollout:
    """TRL's `rollout_func`: M trees per question of the (M, N, L) shape, on the trainer's current policy.

    env: the `tg` environment (prompt template, tool, observation tokens), e.g. `tg.agent.tasks.make_env`.
    M, N, L: trees per prompt, nodes expanded per tree per round, rounds (tree.M / tree.N / tree.L).
    node_rule: the expansion node rule (`tg.tree.NODE_RULES`).
    max_step_tokens, max_context_tokens: as agent.max_step_tokens / agent.max_context_tokens.
    """

    env: Environment
    M: int
    N: int
    L: int
    node_rule: str = "paper"
    max_step_tokens: int = 500
    max_context_tokens: int = 4096

    @classmethod
    def from_config(cls, cfg: Config, env: Environment) -> "TreeRollout":
        t, a = cfg.tree, cfg.agent
        return cls(env, t.M, t.N, t.L, t.node_rule, a.max_step_tokens, a.max_context_tokens)

    @property
    def leaves_per_prompt(self) -> int:
        """K = M (1 + L N): TRL's `num_generations`."""
        return self.M * (1 + self.L * self.N)

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, list]:
        questions = distinct_prompts(prompts, self.leaves_per_prompt)
        seed = shard_seed(rollout_seed(trainer.args.seed, trainer.state.global_step), trainer.accelerator.process_index)
        with generation_model(trainer) as model:
            was_training = model.training
            model.eval()
            try:
                trees, _ = sample_trees(HFEngine(model, trainer.processing_class), self.env,
                                        [self.env.prompt_ids(q) for q in questions], M=self.M, N=self.N, L=self.L,
                                        node_rule=self.node_rule, rng=random.Random(seed),
                                        sampling=Sampling(trainer.temperature, trainer.args.top_p, seed),
                                        max_step_tokens=self.max_step_tokens,
                                        max_context_tokens=self.max_context_tokens)
            finally:
                model.train(was_training)
        return tree_completions([t for ts in trees for t in ts], self.M)


@contextlib.contextmanager
def generation_model(trainer: GRPOTrainer) -> Iterator[Any]:
    """The trained model as the rollout samples from it: inside TRL's own `unwrap_model_for_generation` (ZeRO-3:
    every parameter gathered and the hooks removed; gradient checkpointing off), and under FSDP2 every unit
    unsharded once for the whole rollout (`tg.gpu.fsdp.gathered`: ranks grow different trees, so a gather at
    each forward would wait for ranks that have finished)."""
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=True,
                                     gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs
                                     ) as model, gathered(trainer.model_wrapped), torch.no_grad():
        yield model


def distinct_prompts(prompts: Sequence[Any], k: int) -> list[str]:
    """The questions of TRL's repeated batch: each run of `k` equal prompts is one question."""
    if len(prompts) % k:
        raise ConfigError(f"the rollout got {len(prompts)} prompts, not whole groups of num_generations = {k}: make "
                          "per_device_train_batch_size x steps_per_generation a multiple of M (1 + L N)")
    runs = [prompts[i:i + k] for i in range(0, len(prompts), k)]
    for run in runs:
        if not isinstance(run[0], str):
            raise ConfigError("the dataset's 'prompt' column must hold the question text (a str); the rollout "
                              f"applies the environment's prompt template itself, got {type(run[0]).__name__}")
        if any(p != run[0] for p in run):
            raise ConfigError(f"prompts {run[0]!r} and others share one group of num_generations = {k}: TRL groups "
                              "must be runs of one prompt (its RepeatSampler's order)")
    return [run[0] for run in runs]


def tree_completions(trees: Sequence[Tree], M: int) -> dict[str, list]:
    """TRL's rollout output for trees listed M per prompt, one entry per leaf (module docstring, 2)."""
    out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "tree_id",
                                            "step_texts")}
    for k, tree in enumerate(trees):
        for leaf in tree.leaves():
            traj = tree.trajectory(leaf)
            out["prompt_ids"].append(list(traj.prompt_ids))
            out["completion_ids"].append(traj.response_ids)
            out["env_mask"].append(traj.response_mask)
            out["logprobs"].append([lp for s in traj.steps
                                    for lp in (s.logprobs or [0.0] * len(s.gen_ids)) + [0.0] * len(s.obs_ids)])
            out["tree_id"].append(k % M)
            out["step_texts"].append([s.text for s in traj.steps])
    return out


def tree_reward(reward: Reward) -> Callable[..., list[float]]:
    """A TRL reward function scoring each leaf with a `tg` reward (e.g. Eq. 13, `tg.agent.tasks.make_reward`) on
    the rollout's `step_texts` and the dataset's `golden_answers` column."""
    def tg_reward(prompts: list, completions: list, step_texts: list[list[str]], golden_answers: list[list[str]],
                  **kwargs: Any) -> list[float]:
        return [float(reward(texts, golds)) for texts, golds in zip(step_texts, golden_answers)]
    return tg_reward


def questions_dataset(questions: Sequence[Question]) -> Any:
    """A `datasets.Dataset` with TRL's 'prompt' column (the question text) and 'golden_answers'."""
    from datasets import Dataset
    return Dataset.from_dict({"prompt": [q.question for q in questions],
                              "golden_answers": [list(q.golden_answers) for q in questions]})


def grpo_config_kwargs(cfg: Config) -> dict[str, Any]:
    """GRPOConfig arguments that make TRL's loss `tg.loss.grpo_loss` under `cfg.optim` (Eq. 8 in the paper's
    settings) and its batch one tree group per prompt; options TRL cannot express are refused."""
    o, a = cfg.optim, cfg.agent
    for name, value in (("optim.dual_clip", o.dual_clip), ("optim.entropy_coef", o.entropy_coef),
                        ("optim.step_groups", o.step_groups)):
        if value:
            raise ConfigError(f"{name} = {value}: TRL's GRPOTrainer has no equivalent here; set it to 0")
    bf16 = resolve_dtype(cfg.model.dtype, default_device()) == torch.bfloat16  # TRL's default is bf16 autocast
    return dict(num_generations=cfg.tree.M * (1 + cfg.tree.L * cfg.tree.N), loss_type=LOSS_TYPES[o.loss_agg],
                beta=o.kl_beta, epsilon=o.clip_low, epsilon_high=o.clip_high, importance_sampling_level=o.ratio,
                use_bias_correction_kl=False, num_iterations=1, temperature=a.temperature, top_p=a.top_p,
                learning_rate=o.lr, weight_decay=o.weight_decay, max_grad_norm=o.grad_clip, max_steps=o.steps,
                lr_scheduler_type="constant_with_warmup", warmup_steps=round(o.warmup_ratio * o.steps), seed=o.seed,
                bf16=bf16)


def check_args(args: GRPOConfig, rollout: TreeRollout, mode: str) -> None:
    """Refuse, with the setting to change, a TRL configuration the tree advantage or rollout would silently break."""
    if not isinstance(rollout, TreeRollout):
        raise ConfigError("TreeGRPOTrainer: rollout_func must be a TreeRollout (it supplies the trees)")
    k = rollout.leaves_per_prompt
    problems = [
        (mode not in MODES, f"advantage must be one of {MODES}, got {mode!r}"),
        (args.num_generations != k, f"num_generations = {args.num_generations}: set it to M (1 + L N) = {k}"),
        (args.num_generations_eval not in (None, k), f"num_generations_eval: leave it unset or set it to {k}"),
        ((args.per_device_train_batch_size * args.steps_per_generation) % k != 0,
         f"per_device_train_batch_size x steps_per_generation must be a multiple of {k} (whole trees per process)"),
        (args.scale_rewards != "group", "scale_rewards: leave it 'group'; the advantage is tg's (Eq. 5-7)"),
        (args.multi_objective_aggregation != "sum_then_normalize",
         "multi_objective_aggregation: leave it 'sum_then_normalize'; the tree advantage normalises the sum"),
        (args.mask_truncated_completions, "mask_truncated_completions must be False: a leaf ends at </answer>, "
                                          "not at EOS, so TRL would mask every leaf"),
        (args.use_vllm, "use_vllm must be False: the tree rollout samples from the trained model itself (the HF "
                        "engine inside TRL's parameter gathering); TRL's vLLM modes are not supported"),
    ]
    for bad, message in problems:
        if bad:
            raise ConfigError(f"TreeGRPOTrainer: {message}")


class TreeGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose advantages are Tree-GRPO's (Eq. 7, `tg.advantage.tree_grpo_parts`), not TRL's.

    advantage: "intra+inter" (the paper), "intra" or "inter" (optim.advantage); eps, unbiased, singleton: as
    `tg.advantage.group_relative` (optim.adv_eps / adv_unbiased_std / adv_singleton).
    """

    def __init__(self, model: Any, reward_funcs: Any, args: GRPOConfig, *, rollout_func: TreeRollout,
                 advantage: str = "intra+inter", eps: float = 1e-6, unbiased: bool = True,
                 singleton: str = "zero", **kwargs: Any) -> None:
        check_args(args, rollout_func, advantage)
        self.tree_options = dict(mode=advantage, eps=eps, unbiased=unbiased, singleton=singleton)
        self.last_tree_advantage: TreeAdvantage | None = None
        """The whole generation batch's last advantages and their parts, in float64 (for inspection and tests)."""
        super().__init__(model, reward_funcs, args, rollout_func=rollout_func, **kwargs)
        if self._dist.fsdp_version == 1:
            raise ConfigError("TreeGRPOTrainer: FSDP1 cannot run the tree rollout's forwards on gathered weights; set "
                              "fsdp_config={'fsdp_version': 2}")

    def _calculate_rewards(self, inputs: list[dict], *rest: Any) -> torch.Tensor:
        rewards_per_func = super()._calculate_rewards(inputs, *rest)  # [global B, n_funcs], gathered
        self._tree_ids = [x["tree_id"] for x in inputs]
        self._rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        weighted = self._rewards_per_func.double() * self.reward_weights.to(self._rewards_per_func.device).double()
        if torch.isnan(weighted).all(dim=1).any():
            raise ValueError("a leaf has no reward (every reward function returned None): each leaf needs one")
        rewards = weighted.nansum(dim=1).cpu()                                    # [global B], TRL's weighted sum
        tree = torch.tensor(gather_object(self._tree_ids))                         # [global B]
        prompt = torch.arange(len(rewards)) // self.args.num_generations          # TRL's contiguous groups
        adv = tree_grpo_parts(rewards, tree, prompt, **self.tree_options)
        self.last_tree_advantage = adv
        n, rank = len(inputs), self.accelerator.process_index
        out["advantages"] = adv.total[rank * n:(rank + 1) * n].to(out["advantages"].device, out["advantages"].dtype)
        logged = self._logs["advantages"]   # the completions table shows the advantage trained: TRL's replaced
        for _ in range(min(len(adv.total), len(logged))):
            logged.pop()
        logged.extend(adv.total.tolist())
        for name, part in (("adv_intra_std", adv.intra), ("adv_inter_std", adv.inter)):
            self._metrics[mode][f"tg/{name}"].append(float(part.std()))
        return out
