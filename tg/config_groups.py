"""The config's groups, one frozen dataclass each, every field documented with its paper value where it has
one (paper Table 5): model, data, warm-up, agent, tree, optimisation, evaluation. Each group checks its own
ranges (`validate`); `tg.config.Config` holds one of each and checks what spans groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from tg.config_values import check as _check

NODE_RULE_NAMES = ("paper", "official", "entropy")
"""The values of `tree.node_rule`: the keys of `tg.tree.NODE_RULES` (named here so the config imports no torch)."""

SMOL_NAME = "smollm2-135m-instruct"
"""`model.name_or_path` of the smol preset: SmolLM2-135M-Instruct from its package (tg.agent.smol), never a hub id."""
CPU_MODELS = ("tiny", SMOL_NAME)
"""The models the kit gets without a hub and trains on a CPU: the tiny one it builds, SmolLM2 from its package."""


@dataclass(frozen=True)
class ModelConfig:
    """The policy: which weights, which precision, which parameters are trained."""

    name_or_path: str = "tiny"
    """'tiny' builds a toy Qwen2ForCausalLM + local tokenizer; 'smollm2-135m-instruct' is SmolLM2-135M-Instruct
    from its package (tg.agent.smol); else a hub id or a local directory."""
    hidden_size: int = 128
    """Tiny model only: hidden width (Qwen2Config.hidden_size)."""
    num_layers: int = 4
    """Tiny model only: decoder layers."""
    num_heads: int = 4
    """Tiny model only: attention heads."""
    num_kv_heads: int = 2
    """Tiny model only: key/value heads (grouped-query attention, as in Qwen2.5)."""
    intermediate_size: int = 512
    """Tiny model only: MLP width."""
    dtype: str = "auto"
    """'auto' = float32 on CPU (bf16 is slower there), bfloat16 on CUDA; or 'float32' / 'bfloat16'."""
    finetune: str = "full"
    """'full' (the paper's setting), 'lora' (peft on the full-precision base) or 'qlora' (4-bit NF4 base + LoRA)."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)."""
    lora_dropout: float = 0.0
    """LoRA dropout (0: rollouts and training see the same function)."""
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Modules that get LoRA adapters."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (needed for 1.5B on one GPU; QLoRA uses use_reentrant=False)."""

    def validate(self) -> None:
        _check(self.name_or_path != "", "model.name_or_path", "'tiny', a hub id or a model directory",
               self.name_or_path)
        _check(len(self.lora_targets) >= 1, "model.lora_targets", "one module name or more", self.lora_targets)
        _check(self.dtype in ("auto", "float32", "bfloat16"), "model.dtype", "'auto', 'float32', 'bfloat16'", self.dtype)
        _check(self.finetune in ("full", "lora", "qlora"), "model.finetune", "'full', 'lora', 'qlora'", self.finetune)
        for n in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "lora_r", "lora_alpha"):
            _check(getattr(self, n) >= 1, f"model.{n}", ">= 1", getattr(self, n))
        _check(self.hidden_size % self.num_heads == 0, "model.hidden_size", "a multiple of model.num_heads", self.hidden_size)
        _check(self.num_heads % self.num_kv_heads == 0, "model.num_kv_heads", "a divisor of model.num_heads", self.num_kv_heads)
        _check(0.0 <= self.lora_dropout < 1.0, "model.lora_dropout", "[0, 1)", self.lora_dropout)


@dataclass(frozen=True)
class DataConfig:
    """Where questions and documents come from: the synthetic world (cpu) or NQ/HotpotQA + wiki-18."""

    source: str = "synthetic"
    """'synthetic' (the kit's generated multi-hop world) or 'files' (Search-R1/FlashRAG parquet or JSONL)."""
    setting: str = "multi-hop"
    """Training set: 'single-hop' (NQ-like) or 'multi-hop' (HotpotQA-like); evaluation covers both where available."""
    data_dir: str = "data"
    """Directory holding train/test files and the corpus (relative paths are under the repo root)."""
    world_seed: int = 0
    """Synthetic world: seed of the generator (same seed, same world)."""
    n_countries: int = 12
    """Synthetic world: countries."""
    n_cities: int = 36
    """Synthetic world: cities."""
    n_companies: int = 48
    """Synthetic world: companies."""
    n_people: int = 120
    """Synthetic world: people."""
    n_test_single: int = 150
    """Test questions needing 1 hop (at least 150 so one question is < 1 EM point)."""
    n_test_multi: int = 300
    """Test questions needing 2-4 hops (at least 300)."""
    retriever: str = "bm25"
    """'bm25' (bm25s over the corpus) or 'http' (a Search-R1 style /retrieve server at retriever_url)."""
    retriever_url: str = "http://127.0.0.1:8000/retrieve"
    """Search-R1 retrieval-server endpoint, used when retriever = 'http'."""
    top_k: int = 3
    """Documents per search (paper: 3)."""

    def validate(self) -> None:
        _check(self.source in ("synthetic", "files"), "data.source", "'synthetic', 'files'", self.source)
        _check(self.setting in ("single-hop", "multi-hop"), "data.setting", "'single-hop', 'multi-hop'", self.setting)
        _check(self.retriever in ("bm25", "http"), "data.retriever", "'bm25', 'http'", self.retriever)
        _check(self.top_k >= 1, "data.top_k", ">= 1", self.top_k)
        _check(self.data_dir != "", "data.data_dir", "a directory", self.data_dir)
        _check(self.world_seed >= 0, "data.world_seed", ">= 0", self.world_seed)
        url = urlsplit(self.retriever_url)
        _check(url.scheme in ("http", "https") and bool(url.netloc), "data.retriever_url",
               "an http(s) URL like http://127.0.0.1:8000/retrieve", self.retriever_url)
        for n in ("n_countries", "n_cities", "n_companies", "n_people"):
            _check(getattr(self, n) >= 2, f"data.{n}", ">= 2", getattr(self, n))
        _check(self.n_test_single >= 1, "data.n_test_single", ">= 1", self.n_test_single)
        _check(self.n_test_multi >= 1, "data.n_test_multi", ">= 1", self.n_test_multi)


@dataclass(frozen=True)
class WarmupConfig:
    """Supervised warm-up of the tiny policy on scripted demonstrations (cpu preset only)."""

    enabled: bool = True
    """Run the warm-up (cached on disk by config hash). The paper presets start from a pretrained model."""
    n_demos: int = 600
    """Scripted demonstrations (episodes) to train on."""
    multi_hop_share: float = 0.3
    """Share of multi-hop questions among the demonstrations (the rest are one-hop). Lower = harder start."""
    early_stop_share: float = 0.5
    """Share of multi-hop demonstrations that stop one hop early and answer the intermediate entity."""
    steps: int = 700
    """Optimiser steps (copying names out of documents appears after ~250-450 of them, see tg/agent/sft.py)."""
    batch_size: int = 32
    """Demonstrations per step."""
    lr: float = 3e-3
    """AdamW learning rate (6e-3 delayed copying past 500 steps in one measured run)."""
    observation_loss: bool = True
    """Also fit the observation (document) tokens, as pretraining would: copying is learnt sooner and
    more reliably (tg/agent/sft.py). RL always masks observations."""
    seed: int = 0
    """Seed of the demonstrations and initial weights."""

    def validate(self) -> None:
        _check(0.0 <= self.multi_hop_share <= 1.0, "warmup.multi_hop_share", "[0, 1]", self.multi_hop_share)
        _check(0.0 <= self.early_stop_share <= 1.0, "warmup.early_stop_share", "[0, 1]", self.early_stop_share)
        _check(self.n_demos >= 1 and self.steps >= 0 and self.batch_size >= 1, "warmup.n_demos/steps/batch_size",
               "n_demos >= 1, steps >= 0, batch_size >= 1", (self.n_demos, self.steps, self.batch_size))
        _check(self.lr > 0, "warmup.lr", "> 0", self.lr)
        _check(self.seed >= 0, "warmup.seed", ">= 0", self.seed)


@dataclass(frozen=True)
class AgentConfig:
    """The ReAct search agent's episode (paper §3.1, App. B.1, Table 5)."""

    max_turns: int = 3
    """Tool-call cap: steps before the forced final step with search disabled (paper: 3). Counts the shared prefix's steps."""
    max_step_tokens: int = 500
    """Per-step generation cap (the official code's max_response_length = 500)."""
    max_obs_tokens: int = 500
    """Observation tokens kept per search (paper: 500)."""
    max_context_tokens: int = 4096
    """Cap on the rolling context (the paper's 'max response length 4096')."""
    temperature: float = 1.0
    """Rollout temperature (paper scripts: 1.0)."""
    top_p: float = 0.95
    """Rollout nucleus (official yaml: 0.95)."""
    env: str = "search"
    """The task: 'search' (the search tool over data.*, reward agent.reward) or 'calculator' (generated arithmetic
    questions and a calculator tool, Eq. 13 with a numeric score; tg.agent.calculator, docs/environments.md)."""
    reward: str = "paper"
    """'paper' = Eq. 13: EM - lambda_f if the format is wrong; 'official' = the code's 1/0.8/0.2/0.1/0 tiers."""
    format_penalty: float = 0.2
    """lambda_f of Eq. 13."""
    engine: str = "hf"
    """Rollout engine: 'hf' (transformers, tg's decode loop) or 'vllm' (vLLM with prefix caching; synced every step)."""
    vllm_kv_cache_gib: float = 1.0
    """vLLM on CPU: KV-cache space in GiB (too large fails vLLM's NUMA memory check at start-up)."""
    vllm_gpu_memory_utilization: float = 0.5
    """vLLM on GPU: share of GPU memory for weights + KV cache (the rest is the trainer's)."""

    def validate(self) -> None:
        _check(self.engine in ("hf", "vllm"), "agent.engine", "'hf', 'vllm'", self.engine)
        _check(self.vllm_kv_cache_gib > 0 and 0 < self.vllm_gpu_memory_utilization < 1,
               "agent.vllm_kv_cache_gib/vllm_gpu_memory_utilization", "> 0 and (0, 1)",
               (self.vllm_kv_cache_gib, self.vllm_gpu_memory_utilization))
        _check(self.max_turns >= 0, "agent.max_turns", ">= 0", self.max_turns)
        for n in ("max_step_tokens", "max_obs_tokens", "max_context_tokens"):
            _check(getattr(self, n) >= 1, f"agent.{n}", ">= 1", getattr(self, n))
        _check(self.temperature >= 0.0, "agent.temperature", ">= 0 (0 = greedy)", self.temperature)
        _check(0.0 < self.top_p <= 1.0, "agent.top_p", "(0, 1]", self.top_p)
        _check(self.env in ("search", "calculator"), "agent.env", "'search', 'calculator'", self.env)
        _check(self.reward in ("paper", "official"), "agent.reward", "'paper', 'official'", self.reward)
        _check(0.0 <= self.format_penalty <= 1.0, "agent.format_penalty", "[0, 1]", self.format_penalty)


@dataclass(frozen=True)
class TreeConfig:
    """Rollout shape: chains (N = L = 0) or initialize-then-expand trees (paper §3.1, Algorithm 1)."""

    M: int = 2
    """Trees per prompt (chains seeding them). A chain baseline of group size G is M = G, N = L = 0."""
    N: int = 2
    """Nodes expanded per tree per round."""
    L: int = 1
    """Expansion rounds."""
    node_rule: str = "paper"
    """Node-selection strategy (`tg.tree.NODE_RULES`): 'paper': N distinct non-leaf step nodes at random;
    'official': N draws with replacement over root + non-leaf nodes; 'entropy': the N non-leaf step nodes
    whose steps had the highest mean token entropy."""
    prefix_reuse: bool = True
    """Prefill a shared context once and decode its branches from copies of its KV cache."""

    def validate(self) -> None:
        _check(self.M >= 1, "tree.M", ">= 1", self.M)
        _check(self.N >= 0, "tree.N", ">= 0", self.N)
        _check(self.L >= 0, "tree.L", ">= 0", self.L)
        _check((self.N == 0) == (self.L == 0), "tree.N/tree.L", "N = 0 if and only if L = 0 (a chain)", (self.N, self.L))
        _check(self.node_rule in NODE_RULE_NAMES, "tree.node_rule", "one of " + ", ".join(map(repr, NODE_RULE_NAMES)),
               self.node_rule)

    @property
    def is_chain(self) -> bool:
        return self.N == 0

    @property
    def leaves_per_tree(self) -> int:
        return 1 + self.L * self.N

    @property
    def group_size(self) -> int:
        """Trajectories per prompt, M (1 + L N)."""
        return self.M * self.leaves_per_tree

    @property
    def chain_equivalent_budget(self) -> float:
        """M (1 + L N / 2): Eq. 4 with the factor M restored on its second term (docs/paper.md#budget)."""
        return self.M * (1 + self.L * self.N / 2)


@dataclass(frozen=True)
class OptimConfig:
    """GRPO / Tree-GRPO optimisation (paper §3.2, Table 5)."""

    steps: int = 60
    """Training steps (paper: 180)."""
    prompts_per_step: int = 16
    """Prompts per step (paper: 512)."""
    mini_batch_prompts: int = 16
    """Prompts per PPO mini-batch (paper: 64, i.e. 8 updates per step)."""
    micro_batch_rows: int = 32
    """Training rows per forward/backward (gradient accumulation fits memory)."""
    rollout_shards: int = 1
    """Split each step's prompts into this many equal shards, each rolled out from its own seed (tg.gpu.distributed):
    a run on K ranks needs a multiple of K, and one process with the same value samples the same tokens."""
    parallel: str = "auto"
    """Several ranks: 'ddp' (replicated model, DistributedDataParallel), 'fsdp' (FSDP2 fully_shard: model,
    gradients and optimiser state sharded; full fine-tuning only) or 'auto' (fsdp for full, ddp for LoRA / QLoRA)."""
    pack_trees: bool = True
    """Train each tree's rows in one packed sequence along their shared prefixes (tg.packing): the same
    log-probs up to float order, far fewer tokens for trees; chains are unchanged. Off in the GPU presets,
    where the dense tree masks of 4k-token trees are untested."""
    lr: float = 1e-4
    """AdamW learning rate (paper: 1e-6 full fine-tuning; LoRA needs larger, see the preset)."""
    warmup_ratio: float = 0.0
    """Linear LR warm-up share of the steps, then constant (paper scripts: tree 0.285, GRPO 0.5)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global grad-norm clip."""
    advantage: str = "intra+inter"
    """'chain', 'inter', 'intra' or 'intra+inter' (Eq. 5-7); chains always use 'chain'."""
    adv_eps: float = 1e-6
    """Epsilon added to the group std."""
    adv_unbiased_std: bool = True
    """n-1 std as torch.std (the official code) or the population std."""
    adv_singleton: str = "zero"
    """Group of one: 'zero' advantage, or 'raw' = the official code's mean 0, std 1."""
    clip_low: float = 0.2
    """PPO ratio clip below 1."""
    clip_high: float = 0.2
    """PPO ratio clip above 1."""
    dual_clip: float = 0.0
    """Dual-clip constant c for negative advantages (official code: 3.0; 0 = off)."""
    loss_agg: str = "seq-mean"
    """'seq-mean' = Eq. 8 (tokens of a trajectory, then trajectories); 'token-mean' = the official code."""
    ratio: str = "token"
    """Importance ratio: 'token' = Eq. 8 (per token); 'sequence' = GSPO's length-normalised sequence ratio (the
    paper's GSPO baseline, tg.loss.gspo_policy_loss; GSPO itself clips at clip_low=3e-4, clip_high=4e-4)."""
    step_groups: float = 0.0
    """Chains only: weight omega of GiGPO's step-group advantage added to the episode one
    (tg.advantage.step_group_advantages; 0 = off, plain chain GRPO)."""
    kl_beta: float = 0.001
    """K3 KL-in-loss coefficient (paper: 0.001)."""
    entropy_coef: float = 0.0
    """Entropy bonus (official yaml: 0.001; the paper mentions none)."""
    seed: int = 0
    """Seed of question order, sampling and node choice."""
    checkpoint_every: int = 10
    """Steps between atomic checkpoints (0 = only at the end)."""
    eval_every: int = 0
    """Steps between evaluations during training (0 = only at the end)."""

    def eval_points(self) -> list[int]:
        """The steps after which `tg train` evaluates: every eval_every steps, and at the end."""
        return sorted({*range(self.eval_every, self.steps, self.eval_every), self.steps}) if self.eval_every else [self.steps]

    def validate(self) -> None:
        _check(self.eval_every >= 0 and self.checkpoint_every >= 0, "optim.eval_every/checkpoint_every", ">= 0",
               (self.eval_every, self.checkpoint_every))
        for n in ("steps", "prompts_per_step", "mini_batch_prompts", "micro_batch_rows"):
            _check(getattr(self, n) >= 1, f"optim.{n}", ">= 1", getattr(self, n))
        _check(self.step_groups >= 0, "optim.step_groups", ">= 0", self.step_groups)
        _check(self.prompts_per_step % self.mini_batch_prompts == 0, "optim.mini_batch_prompts",
               "a divisor of optim.prompts_per_step", self.mini_batch_prompts)
        _check(self.rollout_shards >= 1 and self.mini_batch_prompts % self.rollout_shards == 0, "optim.rollout_shards",
               "a divisor of optim.mini_batch_prompts (each shard gives every mini-batch the same share)",
               self.rollout_shards)
        _check(self.parallel in ("auto", "ddp", "fsdp"), "optim.parallel", "'auto', 'ddp', 'fsdp'", self.parallel)
        _check(self.lr > 0, "optim.lr", "> 0", self.lr)
        _check(self.weight_decay >= 0, "optim.weight_decay", ">= 0", self.weight_decay)
        _check(self.adv_eps > 0, "optim.adv_eps", "> 0 (it divides by std + adv_eps, and a group's std can be 0)",
               self.adv_eps)
        _check(self.seed >= 0, "optim.seed", ">= 0", self.seed)
        _check(0.0 <= self.warmup_ratio <= 1.0, "optim.warmup_ratio", "[0, 1]", self.warmup_ratio)
        _check(self.grad_clip > 0, "optim.grad_clip", "> 0 (a negative clip reverses every update)", self.grad_clip)
        _check(self.advantage in ("chain", "inter", "intra", "intra+inter"), "optim.advantage",
               "'chain', 'inter', 'intra', 'intra+inter'", self.advantage)
        _check(self.adv_singleton in ("zero", "raw"), "optim.adv_singleton", "'zero', 'raw'", self.adv_singleton)
        _check(0.0 <= self.clip_low < 1.0 and self.clip_high >= 0.0, "optim.clip_low/clip_high",
               "0 <= clip_low < 1, clip_high >= 0", (self.clip_low, self.clip_high))
        _check(self.dual_clip == 0.0 or self.dual_clip > 1.0, "optim.dual_clip", "0 (off) or > 1", self.dual_clip)
        _check(self.loss_agg in ("seq-mean", "token-mean"), "optim.loss_agg", "'seq-mean', 'token-mean'", self.loss_agg)
        _check(self.ratio in ("token", "sequence"), "optim.ratio", "'token', 'sequence'", self.ratio)
        _check(self.kl_beta >= 0 and self.entropy_coef >= 0, "optim.kl_beta/entropy_coef", ">= 0",
               (self.kl_beta, self.entropy_coef))


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation: one greedy chain per question, pure EM (docs/paper.md#evaluation)."""

    n_single: int = 150
    """Test questions evaluated per single-hop data source (the first n of each; 0 = all)."""
    n_multi: int = 300
    """Test questions evaluated per multi-hop data source (the first n of each; 0 = all)."""
    batch_size: int = 64
    """Questions per batched rollout."""

    def validate(self) -> None:
        _check(self.n_single >= 0 and self.n_multi >= 0, "eval.n_single/n_multi", ">= 0", (self.n_single, self.n_multi))
        _check(self.batch_size >= 1, "eval.batch_size", ">= 1", self.batch_size)
