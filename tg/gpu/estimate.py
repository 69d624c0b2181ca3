"""Memory and wall-time estimates for one run on one GPU or per rank on K: pure arithmetic, no torch, no I/O.

`tg preflight` (tg/gpu/preflight.py) feeds these functions a model shape, the config and either a
measured or an assumed throughput; the tests check every size against a hand computation for
Qwen2.5-1.5B. Sizes are bytes; "GiB" is 2**30 bytes.

Where the bytes go (QLoRA, the paper presets):
- the base: decoder Linear weights in NF4 (0.5 byte/param + one fp32 absmax per 64 weights, no
  double quantisation), every other parameter (embeddings, norms, biases) in the compute dtype (bf16 on
  a GPU; `tg.agent.finetune` does not cast them to fp32 as peft's `prepare_model_for_kbit_training` would);
- LoRA: A and B per target module, fp32 (peft's default autocast), with fp32 grads and AdamW's two
  fp32 moments: 16 bytes per LoRA parameter;
- activations of the longest micro-batch (`activation_bytes`) and the rollout KV cache of the engine;
- LoRA on a full-precision base with the HF engine: the copy with the adapters folded in that the rollout samples
  from (`tg.agent.finetune.folded_lora`), a whole model in the compute dtype.

Stated assumptions, numbered (estimates, not measurements; the measured tokens/s of `tg preflight`
on the GPU replace the throughput ones):
1. A decoder layer keeps (6 h + 2 kv + 4 i) bf16 values per token for its backward (layer input, norm
   outputs, q / k / v, attention output, gate, up, activation, product); with gradient checkpointing
   only the layer input is kept, and one layer at a time is recomputed.
2. The logits cost 16 bytes per token and vocabulary entry: bf16 logits (2), the fp32 copy that
   `tg.loss.token_logprobs` keeps for the backward (4), fp32 temporaries (logsumexp, entropy) and the
   gradients of both copies. Measured on an H200 (scripts/gpu_smoke.sh: QLoRA, gradient checkpointing,
   a random-init model of Qwen2.5-1.5B's shape, 2 and 8 rows of 4,596 tokens): peak 23.07 and
   87.86 GiB, a slope of 15.4 bytes per token and entry beside the layers' share; rounded up so the
   estimate stays an upper bound (24.0 and 91.0 GiB for those two). For Qwen2.5's 151,936-entry
   vocabulary this term dominates. The trainer runs the log-prob and entropy math at policy tokens only
   (`tg.batch.micro_inputs`), so for its micro-batches the term is an upper bound.
3. vLLM takes `gpu_memory_utilization` of the whole GPU for its weights (bf16, full model), its
   profiling activations (`VLLM_OVERHEAD`) and the KV cache (the rest).
4. CUDA context and allocator slack: `CUDA_OVERHEAD` per process.
5. A forward pass costs a third of a forward + backward (`FORWARD_SHARE`).
6. K GPUs (tg.gpu.distributed): each rank rolls out and trains P / K prompts and evaluates 1 / K of the questions,
   so the wall time divides by K (communication not counted). Full fine-tuning over K > 1 ranks is sharded
   by FSDP2 (tg.gpu.fsdp): weights, reference, gradients and AdamW moments take 1 / K per rank, and a rollout
   gathers one whole bf16 copy of the policy (`MemoryEstimate.gathered`). LoRA / QLoRA ranks are replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from tg.agent.data import SETTINGS, TEST_SIZES
from tg.config import Config

GIB = 2**30
NF4_BYTES_PER_PARAM = 0.5 + 4 / 64
"""4-bit weight plus one fp32 absmax per block of 64 (bitsandbytes NF4, no double quantisation)."""
LORA_BYTES_PER_PARAM = 16
"""fp32 weight 4 + fp32 grad 4 + AdamW exp_avg 4 + exp_avg_sq 4."""
LOGIT_BYTES = 16
"""Assumption 2: bytes per token per vocabulary entry for the logits and the log-prob / entropy math."""
CUDA_OVERHEAD = 1 * GIB
"""Assumption 4."""
VLLM_OVERHEAD = 2 * GIB
"""Assumption 3: vLLM's profiling activations and CUDA graphs, outside the KV cache."""
FORWARD_SHARE = 1 / 3
"""Assumption 5."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Qwen2-class decoder (the fields of its `config.json`)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied_embeddings: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the k (or v) projection: kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each decoder Linear, by its module name (Qwen2 naming, LoRA targets)."""
        h, kv, i = self.hidden, self.kv_dim, self.intermediate
        return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


QWEN2_5_1_5B = ModelShape(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936,
                          tied_embeddings=True)
"""Qwen/Qwen2.5-1.5B's config.json (used when the config file itself is not at hand)."""
MODEL_SHAPES: dict[str, ModelShape] = {
    "qwen/qwen2.5-1.5b": QWEN2_5_1_5B,
    "qwen/qwen2.5-3b": ModelShape(2048, 36, 16, 2, 11008, 151936, tied_embeddings=True),
    "meta-llama/llama-3.2-3b": ModelShape(3072, 28, 24, 8, 8192, 128256, tied_embeddings=True),
    "qwen/qwen2.5-7b": ModelShape(3584, 28, 28, 4, 18944, 152064, tied_embeddings=False),
    "qwen/qwen2.5-14b": ModelShape(5120, 48, 40, 8, 13824, 152064, tied_embeddings=False),
}
"""The paper's Table 1 models (their config.json; the -Instruct variants share the shape), by lower-case hub id.
Llama has no q/k/v biases: counting them over-estimates it by 0.01%."""
SMOLLM2_135M = ModelShape(576, 30, 9, 3, 1536, 49152, tied_embeddings=True)
"""SmolLM2-135M-Instruct's config.json (the smol preset's model; it has no q/k/v biases: counting them over-estimates it by 0.02%)."""


def known_shape(name: str) -> ModelShape | None:
    """The shape of a Table 1 model from its hub id (or a path ending in it), else None."""
    key = name.lower().removesuffix("-instruct")
    return next((s for k, s in MODEL_SHAPES.items() if key.endswith(k.split("/")[1]) or key == k), None)


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of a model, split by how QLoRA stores them."""

    linear: int
    """Decoder Linear weights (quantised to NF4 under QLoRA)."""
    other: int
    """Embeddings, untied LM head, norms and q/k/v biases (kept in fp32 under QLoRA)."""

    @property
    def total(self) -> int:
        return self.linear + self.other


def param_counts(s: ModelShape) -> ParamCounts:
    """Parameter counts of a Qwen2 decoder: q/k/v carry biases, two RMSNorms per layer plus a final one."""
    linear = s.layers * sum(a * b for a, b in s.linear_shapes().values())
    embed = s.vocab * s.hidden * (1 if s.tied_embeddings else 2)
    per_layer = (s.hidden + 2 * s.kv_dim) + 2 * s.hidden          # biases + norms
    return ParamCounts(linear=linear, other=embed + s.layers * per_layer + s.hidden)


def lora_params(s: ModelShape, r: int, targets: tuple[str, ...]) -> int:
    """LoRA parameters: r (in + out) per target Linear per layer (A is r x in, B is out x r)."""
    shapes = s.linear_shapes()
    return s.layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in targets if t in shapes)


def weight_bytes(s: ModelShape, finetune: str, weight_dtype_bytes: int = 2) -> int:
    """Bytes of the model's weights on the GPU, before any optimiser state.

    qlora: NF4 decoder Linears, the rest at `weight_dtype_bytes` (module docstring). lora / full: every
    parameter at `weight_dtype_bytes` (2 for bf16). Full fine-tuning adds a frozen reference copy (tg.agent.finetune).
    """
    p = param_counts(s)
    if finetune == "qlora":
        return math.ceil(p.linear * NF4_BYTES_PER_PARAM) + weight_dtype_bytes * p.other
    copies = 2 if finetune == "full" else 1
    return copies * p.total * weight_dtype_bytes


def trainable_bytes(s: ModelShape, finetune: str, r: int, targets: tuple[str, ...],
                    weight_dtype_bytes: int = 2) -> int:
    """Grads and AdamW moments (and the LoRA weights themselves) of what is trained.

    LoRA / QLoRA: 16 bytes per LoRA parameter. Full: grad + two moments in the weights' dtype
    (torch's AdamW keeps its state in the parameter dtype), 3 x weight_dtype_bytes per parameter.
    """
    if finetune == "full":
        return 3 * weight_dtype_bytes * param_counts(s).total
    return LORA_BYTES_PER_PARAM * lora_params(s, r, targets)


def activation_bytes(s: ModelShape, rows: int, tokens: int, checkpointing: bool) -> int:
    """Peak activation bytes of one forward + backward on a micro-batch of `rows` x `tokens` (assumptions 1, 2)."""
    n = rows * tokens
    per_layer = 2 * (6 * s.hidden + 2 * s.kv_dim + 4 * s.intermediate)    # bytes per token, one layer
    layers = 2 * s.layers * s.hidden + per_layer if checkpointing else s.layers * per_layer
    return n * (layers + LOGIT_BYTES * s.vocab)


def kv_bytes_per_token(s: ModelShape, dtype_bytes: int = 2) -> int:
    """K and V of every layer for one token: 2 x layers x kv_heads x head_dim x dtype_bytes."""
    return 2 * s.layers * s.kv_dim * dtype_bytes


@dataclass(frozen=True)
class MemoryEstimate:
    """GPU bytes of one run at its peak, by part."""

    weights: int
    trainable: int
    activations: int
    rollout_kv: int
    """HF engine: the KV cache of every row rolled out at once, at full context (an upper bound)."""
    vllm: int
    """vLLM engine: its whole reservation (gpu_memory_utilization x GPU memory)."""
    gathered: int = 0
    """FSDP2 over K > 1 ranks: the whole policy, gathered for the rollout (assumption 6)."""
    folded: int = 0
    """HF engine with LoRA on a full-precision base: the policy with its adapters folded in, kept between rollouts."""
    overhead: int = CUDA_OVERHEAD

    @property
    def total(self) -> int:
        """Rollout and update alternate, so the HF engine's KV and the activations do not add up."""
        return (self.weights + self.trainable + self.folded + max(self.activations, self.rollout_kv + self.gathered)
                + self.vllm + self.overhead)

    def parts_gib(self) -> dict[str, float]:
        return {k: getattr(self, k) / GIB for k in ("weights", "trainable", "activations", "rollout_kv", "vllm",
                                                      "gathered", "folded", "overhead", "total")}


def vllm_kv_tokens(s: ModelShape, gpu_bytes: int, utilization: float) -> int:
    """Tokens of KV cache vLLM can hold: its share, less bf16 weights and overhead (assumption 3)."""
    free = utilization * gpu_bytes - 2 * param_counts(s).total - VLLM_OVERHEAD
    return max(0, int(free // kv_bytes_per_token(s)))


def largest_fitting(rows: int, fits: Callable[[int], bool]) -> int:
    """The largest r in 1..rows with fits(r) (fits is monotone: fewer rows never need more memory); 0 if none."""
    return max((r for r in range(1, rows + 1) if fits(r)), default=0)


@dataclass(frozen=True)
class Workload:
    """Tokens of one run, per step. The two token counts are assumptions until a run measures them."""

    steps: int
    prompts_per_step: int
    chains_per_prompt: float
    """Chain-equivalent rollout budget per prompt: M (1 + L N / 2) (Eq. 4 with the factor M, docs/paper.md#budget)."""
    rows_per_prompt: int
    """Training rows (leaves) per prompt: M (1 + L N)."""
    frozen_passes: int
    """Extra forwards per row without grad: reference (KL) and old log-probs (several mini-batches)."""
    eval_questions: int
    evals: int
    """Evaluations in the run (periodic plus the final one)."""
    gen_tokens_per_chain: int = 400
    """Assumed policy tokens sampled per chain: 2-3 turns of ~150 tokens (the `generated` metric measures it)."""
    row_tokens: int = 1500
    """Assumed tokens per training row: prompt, steps and 2-3 observations of up to 500 tokens."""


def step_seconds(w: Workload, decode_tps: float, train_tps: float) -> float:
    """One training step: rollout at `decode_tps` sampled tokens/s, update at `train_tps` trained tokens/s.

    rollout = prompts x chains_per_prompt x gen_tokens_per_chain / decode_tps
    update  = prompts x rows_per_prompt x row_tokens x (1 + frozen_passes x FORWARD_SHARE) / train_tps
    """
    rollout = w.prompts_per_step * w.chains_per_prompt * w.gen_tokens_per_chain / decode_tps
    update = w.prompts_per_step * w.rows_per_prompt * w.row_tokens * (1 + w.frozen_passes * FORWARD_SHARE) / train_tps
    return rollout + update


def run_seconds(w: Workload, decode_tps: float, train_tps: float) -> float:
    """The whole run: steps x step_seconds, plus evaluations (one greedy chain per question) at the same
    `decode_tps`: they run on the rollout engine (vLLM with agent.engine=vllm)."""
    evals = w.evals * w.eval_questions * w.gen_tokens_per_chain / decode_tps
    return w.steps * step_seconds(w, decode_tps, train_tps) + evals


# ---- from a Config ---------------------------------------------------------------------------------

def longest_row_tokens(cfg: Config) -> int:
    """The longest training row: the context cap plus one observation appended past it (tg.rollout)."""
    return cfg.agent.max_context_tokens + cfg.agent.max_obs_tokens


def sharded(cfg: Config, gpus: int) -> bool:
    """Whether `gpus` ranks shard the model with FSDP2 (tg.gpu.launch.start's choice)."""
    return gpus > 1 and cfg.model.finetune == "full" and cfg.optim.parallel in ("auto", "fsdp")


def rollout_rows(cfg: Config, gpus: int = 1) -> int:
    """Rows of KV the HF engine holds at once: a step's rows (chains: prompts x M; trees: in round l,
    prompts x M x N live branches, each with its own copy of the prefix KV, plus the K/V kept from the
    prompts x M (1 + (l-1) N) rows they branch from, `tg.engines.kvcache.PrefixStore`: prompts x M (1 + L N) at
    most), or one evaluation batch. Over `gpus` ranks each rolls out 1 / gpus of the prompts."""
    t = cfg.tree
    return max(cfg.optim.prompts_per_step // gpus * t.M * (1 + t.N * t.L), cfg.eval.batch_size)


def memory_estimate(s: ModelShape, cfg: Config, gpu_bytes: int, micro_batch_rows: int | None = None,
                    gpus: int = 1) -> MemoryEstimate:
    """Peak GPU bytes of `cfg` on a GPU of `gpu_bytes` (the vLLM share depends on it), per rank of `gpus`."""
    m, a = cfg.model, cfg.agent
    wbytes = 4 if m.dtype == "float32" else 2
    rows = micro_batch_rows or cfg.optim.micro_batch_rows
    hf = a.engine == "hf"
    split = gpus if sharded(cfg, gpus) else 1
    return MemoryEstimate(
        weights=weight_bytes(s, m.finetune, wbytes) // split,
        trainable=trainable_bytes(s, m.finetune, m.lora_r, m.lora_targets, wbytes) // split,
        activations=activation_bytes(s, rows, longest_row_tokens(cfg), m.gradient_checkpointing),
        rollout_kv=rollout_rows(cfg, gpus) * a.max_context_tokens * kv_bytes_per_token(s, wbytes) if hf else 0,
        vllm=0 if hf else int(a.vllm_gpu_memory_utilization * gpu_bytes),
        gathered=param_counts(s).total * wbytes if split > 1 else 0,
        folded=param_counts(s).total * wbytes if hf and m.finetune == "lora" else 0)


def workload(cfg: Config, gpus: int = 1) -> Workload:
    """The run's token workload (the final evaluation of `tg train` included), per rank of `gpus`."""
    o, t = cfg.optim, cfg.tree
    frozen = int(o.kl_beta > 0) + int(o.prompts_per_step // o.mini_batch_prompts > 1)
    e, d = cfg.eval, cfg.data
    # prepared files hold one setting's test sets (sizes: paper App. A); the synthetic world holds both
    if d.source == "synthetic":
        n_eval = min(e.n_single or d.n_test_single, d.n_test_single) + min(e.n_multi or d.n_test_multi, d.n_test_multi)
    else:
        cap = e.n_single if d.setting == "single-hop" else e.n_multi
        n_eval = sum(min(cap or n, n) for n in (TEST_SIZES[s] for s in SETTINGS[d.setting][1]))
    evals = len(o.eval_points())
    return Workload(steps=o.steps, prompts_per_step=o.prompts_per_step // gpus, chains_per_prompt=t.chain_equivalent_budget,
                    rows_per_prompt=t.group_size, frozen_passes=frozen, eval_questions=-(-n_eval // gpus), evals=evals)
