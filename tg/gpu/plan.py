"""`tg plan`: which of the paper's Table 1 models fit on 1, 2, 4 or 8 GPUs of 24, 48 and 80 GB, and what a
paper-schedule run costs on each: estimates from `tg.gpu.estimate`, printed as the tables of docs/gpu.md.

The rows are the paper presets (multi-hop, `paper` schedule, one row per micro-batch) under three set-ups:
- QLoRA, vLLM: the presets as they are, with agent.engine=vllm; ranks are DDP replicas;
- full, HF, FSDP2: `--recipe full` (bf16, lr 1e-6); over K > 1 ranks FSDP2 shards the model (tg.gpu.fsdp);
- full, vLLM, DDP: `--recipe full --set optim.parallel=ddp --set agent.engine=vllm`: replicas, paged KV.
Wall times assume the throughputs of docs/gpu.md for Qwen2.5-1.5B (`ASSUMED_TPS`), scaled by the inverse of
the parameter count, and a perfect split over the ranks (tg.gpu.estimate, assumption 6). They are not measured.
"""

from __future__ import annotations

from tg.config import Config, TABLE1_MODELS, load_config
from tg.gpu.estimate import (GIB, QWEN2_5_1_5B, known_shape, memory_estimate, param_counts, run_seconds,
                             vllm_kv_tokens, workload)

GPU_GIB = (24, 48, 80)
GPU_COUNTS = (1, 2, 4, 8)
ASSUMED_TPS = {"vllm": (8000.0, 6000.0), "hf": (2000.0, 6000.0)}
"""(sampled, trained) tokens/s of one GPU on Qwen2.5-1.5B by rollout engine (docs/gpu.md#schedules)."""
SETUPS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "QLoRA, vLLM": (None, ("agent.engine=vllm",)),
    "full, HF, FSDP2": ("full", ()),
    "full, vLLM, DDP": ("full", ("optim.parallel=ddp", "agent.engine=vllm")),
}
"""Set-up name -> (recipe, overrides)."""


def plan_config(tag: str, setup: str) -> Config:
    recipe, overrides = SETUPS[setup]
    return load_config(f"paper-{tag}-multi-hop", "optim.micro_batch_rows=1", *overrides, schedule="paper",
                       recipe=recipe)


VLLM_SHARES = (0.5, 0.4, 0.3, 0.2)
"""agent.vllm_gpu_memory_utilization values tried, the preset's first: a smaller share leaves the trainer room on a
small GPU as long as vLLM still holds one full-context row (the pre-flight's own fix)."""


def fits(cfg: Config, gpus: int, gib: int) -> bool:
    """Whether the per-rank estimate fits, with vLLM's share of the GPU set as a user would (VLLM_SHARES)."""
    shape = known_shape(cfg.model.name_or_path)
    if cfg.agent.engine != "vllm":
        return memory_estimate(shape, cfg, gib * GIB, gpus=gpus).total <= gib * GIB
    return any(vllm_kv_tokens(shape, gib * GIB, u) >= cfg.agent.max_context_tokens
               and memory_estimate(shape, cfg.replace(agent=dict(vllm_gpu_memory_utilization=u)), gib * GIB,
                                   gpus=gpus).total <= gib * GIB for u in VLLM_SHARES)


def hours(cfg: Config, gpus: int) -> float:
    """Estimated wall hours of the whole run on `gpus` GPUs (training and its three evaluations)."""
    scale = param_counts(QWEN2_5_1_5B).total / param_counts(known_shape(cfg.model.name_or_path)).total
    decode, train = (x * scale for x in ASSUMED_TPS[cfg.agent.engine])
    return run_seconds(workload(cfg, gpus), decode, train) / 3600


def fit_table() -> str:
    """Markdown: for each model and set-up, the GPU counts that fit per GPU size."""
    rows = ["| model | set-up | " + " | ".join(f"{g} GB" for g in GPU_GIB) + " |", "|---|---|" + "---|" * len(GPU_GIB)]
    for tag, model in TABLE1_MODELS.items():
        for setup in SETUPS:
            cfg = plan_config(tag, setup)
            cells = [", ".join(str(k) for k in GPU_COUNTS if fits(cfg, k, g)) or "none" for g in GPU_GIB]
            rows.append(f"| {model} | {setup} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def cost_table(gib: int = 80) -> str:
    """Markdown: estimated wall hours of a paper-schedule run on 1-8 GPUs of `gib` GB ('-': does not fit)."""
    rows = ["| model | set-up | " + " | ".join(f"{k} GPU{'s' if k > 1 else ''}" for k in GPU_COUNTS) + " |",
            "|---|---|" + "---|" * len(GPU_COUNTS)]
    for tag, model in TABLE1_MODELS.items():
        for setup in SETUPS:
            cfg = plan_config(tag, setup)
            cells = [f"~{hours(cfg, k):,.0f} h" if fits(cfg, k, gib) else "-" for k in GPU_COUNTS]
            rows.append(f"| {model} | {setup} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def report() -> str:
    """Both tables with their headings, as docs/gpu.md holds them."""
    return ("Estimated GPU counts that fit (per-rank memory estimate, upper bound; the paper schedule, "
            "multi-hop, 1 row per micro-batch; vLLM's share of the GPU lowered to 0.2 where that helps):\n\n" + fit_table() + "\n\nEstimated wall time of a paper-schedule "
            "run on 80 GB GPUs (assumed throughputs, perfect scaling; '-': does not fit):\n\n" + cost_table())
