"""Pre-flight of a run: can this machine start it, will it fit, how long will it take.

`tg preflight --preset P` runs every check and prints one line per check, with the fix of each
failing one; it exits non-zero when a required check fails. `tg train` runs the same checks before
loading anything (for every model but the tiny one; `--skip-preflight` skips them), then, on a GPU,
runs the longest sample first (`measure_longest_sample`) so that an out-of-memory error happens in
minute one, and prints the estimated wall time of the whole run from the measured tokens/s.

The arithmetic lives in `tg.gpu.estimate` (pure, tested by hand); this module only gathers facts
(CUDA, GPU memory, files, the hub cache, the retriever) and formats them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tg.config import Config, ConfigError
from tg.config_groups import CPU_MODELS, SMOL_NAME
from tg.gpu.estimate import (GIB, SMOLLM2_135M, ModelShape, known_shape, largest_fitting, memory_estimate, run_seconds,
                         sharded, step_seconds, vllm_kv_tokens, workload)

REFERENCE_GPU_GIB = 80
"""GPU size the memory estimate is shown against when no GPU is present."""
MAX_GPUS = 1024
"""The largest `--gpus` the estimates accept: they model the ranks of one torchrun job (the paper trains on 8,
`tg plan` shows 1-8); a count beyond a thousand GPUs is taken for a typo, not estimated."""


@dataclass(frozen=True)
class Check:
    """One pre-flight check: status is 'ok', 'FAIL', 'warn' or 'skip'."""

    name: str
    status: str
    detail: str
    fix: str = ""
    required: bool = True

    @property
    def failed(self) -> bool:
        return self.required and self.status == "FAIL"


@dataclass(frozen=True)
class Throughput:
    """Measured (or given) tokens/s: sampled tokens in rollouts, trained tokens in forward + backward."""

    decode_tps: float
    train_tps: float
    source: str
    peak_gib: float | None = None


def format_report(checks: list[Check]) -> str:
    """One line per check, its fix indented below when it failed or warned; a verdict last."""
    lines = ["pre-flight:"]
    for c in checks:
        tag = c.status if c.required or c.status != "FAIL" else "warn"
        lines.append(f"  [{tag:>4}] {c.name:<10} {c.detail}")
        if c.fix and c.status in ("FAIL", "warn"):
            lines.append(f"  {'':>6} {'':<10} fix: {c.fix}")
    failed = [c.name for c in checks if c.failed]
    lines.append(f"FAILED: {', '.join(failed)}" if failed else "all required checks passed")
    return "\n".join(lines)


# ---- facts ---------------------------------------------------------------------------------------

def gpu_bytes() -> int | None:
    """Total memory of CUDA device 0, or None without CUDA."""
    import torch
    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


def shape_from_config_json(path: str | Path) -> ModelShape:
    c = json.loads(Path(path).read_text())
    return ModelShape(hidden=c["hidden_size"], layers=c["num_hidden_layers"], heads=c["num_attention_heads"],
                      kv_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
                      intermediate=c["intermediate_size"], vocab=c["vocab_size"],
                      tied_embeddings=c.get("tie_word_embeddings", False))


def _cached_config(name: str) -> str | None:
    """config.json of a local model directory or of a hub id in the local hub cache."""
    if (Path(name) / "config.json").is_file():
        return str(Path(name) / "config.json")
    from huggingface_hub import try_to_load_from_cache
    found = try_to_load_from_cache(name, "config.json")
    return found if isinstance(found, str) else None


# ---- checks ---------------------------------------------------------------------------------------

def check_cuda(cfg: Config, memory: int | None) -> Check:
    name = cfg.model.name_or_path
    cpu = name in CPU_MODELS
    if memory is not None:
        import torch
        return Check("cuda", "ok", f"{torch.cuda.get_device_name(0)}, {memory / GIB:.0f} GiB")
    return Check("cuda", "ok" if cpu else "FAIL", "no CUDA device" + (f" (the {name} model runs on CPU)" if cpu else ""),
                 fix="run on a machine with an NVIDIA GPU and a CUDA build of torch (environment.yml); "
                     "`tg doctor` shows the installed torch", required=not cpu)


def check_packages(cfg: Config) -> Check:
    need = (["bitsandbytes"] if cfg.model.finetune == "qlora" else []) + (["vllm"] if cfg.agent.engine == "vllm" else [])
    missing = [p for p in need if importlib.util.find_spec(p) is None]
    if missing:
        return Check("packages", "FAIL", f"missing: {', '.join(missing)}",
                     fix=f"pip install {' '.join(missing)} (offline: pip install --no-index --find-links WHEEL_DIR ...)")
    return Check("packages", "ok", ", ".join(need) + " importable" if need else "nothing extra needed")


def check_model(cfg: Config) -> tuple[Check, ModelShape | None]:
    """Is the model at hand (local directory or hub cache), and what is its shape?"""
    m = cfg.model
    if m.name_or_path == "tiny":
        shape = ModelShape(m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads, m.intermediate_size,
                           vocab=8192, tied_embeddings=False)  # the world's tokenizer has fewer than 8,192 tokens
        return Check("model", "ok", "tiny: built locally by the warm-up"), shape
    if m.name_or_path == SMOL_NAME:  # from its package, never the hub
        from tg.agent.smol import INSTALL, SmolError, checked_gguf
        try:
            src = checked_gguf()
        except SmolError as err:
            return Check("model", "FAIL", str(err), INSTALL), SMOLLM2_135M
        return Check("model", "ok", f"{SMOL_NAME}: {src.name} from its package, sha256 checked"), SMOLLM2_135M
    found = _cached_config(m.name_or_path)
    if found:
        return Check("model", "ok", f"{m.name_or_path} at {Path(found).parent}"), shape_from_config_json(found)
    known = known_shape(m.name_or_path)
    fix = (f"`hf download {m.name_or_path}` where the hub is reachable (then copy its cache), or "
           "set model.name_or_path=/path/to/local/dir")
    if os.environ.get("HF_HUB_OFFLINE"):
        return Check("model", "FAIL", f"{m.name_or_path}: not in the hub cache and HF_HUB_OFFLINE is set", fix), known
    try:
        from huggingface_hub import model_info
        model_info(m.name_or_path, timeout=5)
    except Exception as err:  # any failure (DNS, timeout, 404, auth) means: not reachable from here
        return Check("model", "FAIL", f"{m.name_or_path}: not cached, hub not reachable ({type(err).__name__})",
                     fix), known
    return Check("model", "ok", f"{m.name_or_path}: on the hub, downloaded at start"), known


def check_data(cfg: Config) -> Check:
    from tg.agent.data import DataError, load_questions, split_file
    from tg.agent.world import resolve
    d = cfg.data
    if d.source == "synthetic":
        return Check("data", "ok", "synthetic world (built and cached on first use)")
    try:
        files = [split_file(resolve(d.data_dir), s) for s in ("train", "test")]
    except DataError:
        return Check("data", "FAIL", f"no train/test files under {d.data_dir}",
                     fix=f"tg data prepare --setting {d.setting} --out {d.data_dir}")
    try:
        counts = [len(load_questions(f)) for f in files]  # every row read and checked, as training will
    except DataError as err:
        return Check("data", "FAIL", str(err), fix=f"tg data prepare --setting {d.setting} --out {d.data_dir}")
    return Check("data", "ok", ", ".join(f"{f} ({n:,} questions)" for f, n in zip(files, counts)))


def check_retriever(cfg: Config) -> Check:
    from tg.agent.world import resolve
    d = cfg.data
    if d.retriever == "http":
        from tg.agent.server import HTTPRetriever
        try:
            HTTPRetriever(d.retriever_url, timeout=5, retries=0).search(["preflight"], 1)
        except (ConnectionError, ValueError) as err:
            return Check("retriever", "FAIL", f"{d.retriever_url} does not answer ({type(err).__name__})",
                         fix="start one: `tg retriever serve --corpus data/wiki-18/wiki-18.jsonl --port 8000` (BM25), "
                             "or Search-R1's E5 server; or set data.retriever_url")
        return Check("retriever", "ok", f"{d.retriever_url} answers")
    if d.source == "synthetic":
        return Check("retriever", "ok", "BM25 over the synthetic world")
    corpus = resolve(d.data_dir) / "corpus.jsonl"
    if not corpus.is_file():
        return Check("retriever", "FAIL", f"no BM25 corpus at {corpus}",
                     fix=f"tg data corpus --out {d.data_dir} (then link wiki-18.jsonl as corpus.jsonl), "
                         "or set data.retriever=http")
    return Check("retriever", "ok", f"BM25 over {corpus}")


def check_memory(cfg: Config, shape: ModelShape | None, memory: int | None, gpus: int = 1) -> Check:
    """The estimate (tg.gpu.estimate) per rank of `gpus` against the GPU; the fix names the field to change."""
    if shape is None:
        return Check("memory", "skip", "model shape unknown (config.json not at hand)", required=False)
    gpu = memory or REFERENCE_GPU_GIB * GIB
    est = memory_estimate(shape, cfg, gpu, gpus=gpus)
    parts = ", ".join(f"{k} {v:.1f}" for k, v in est.parts_gib().items() if v)
    per = f" per rank of {gpus}" if gpus > 1 else ""
    detail = (f"estimate (GiB, upper bound){per}: {parts} vs {gpu / GIB:.0f} GiB"
              + ("" if memory else " (no GPU: reference)"))
    if cfg.agent.engine == "vllm":  # vLLM schedules rows into its KV cache; one full-context row must fit
        a = cfg.agent
        kv = vllm_kv_tokens(shape, gpu, a.vllm_gpu_memory_utilization)
        detail += f"; vLLM KV cache ~{kv:,} tokens = {kv // a.max_context_tokens} full-context rows at once"
        if kv < a.max_context_tokens:
            return Check("memory", "FAIL" if memory else "warn", detail, required=memory is not None,
                         fix=f"vLLM cannot hold one {a.max_context_tokens}-token row: raise "
                             f"agent.vllm_gpu_memory_utilization (now {a.vllm_gpu_memory_utilization}) or lower "
                             "agent.max_context_tokens")
    if est.total <= gpu:
        return Check("memory", "ok", detail)
    return Check("memory", "FAIL" if memory else "warn", detail, fix=_memory_fix(cfg, shape, gpu, gpus),
                 required=memory is not None)


def fitting_gpus(cfg: Config, shape: ModelShape, gpu: int, counts: tuple[int, ...] = (1, 2, 4, 8)) -> list[int]:
    """The GPU counts on which `cfg` fits GPUs of `gpu` bytes, by the estimate."""
    return [k for k in counts if cfg.optim.prompts_per_step % k == 0
            and memory_estimate(shape, cfg, gpu, gpus=k).total <= gpu]


def _memory_fix(cfg: Config, shape: ModelShape, gpu: int, gpus: int = 1) -> str:
    est = memory_estimate(shape, cfg, gpu, gpus=gpus)
    more = [k for k in fitting_gpus(cfg, shape, gpu) if k > gpus]
    also = f"; or train on {more[0]} GPUs (docs/distributed.md)" if more else ""
    if est.rollout_kv > est.activations and est.rollout_kv > gpu / 2:
        return (f"the HF engine holds {est.rollout_kv / GIB:.0f} GiB of rollout KV at full context: set "
                f"agent.engine=vllm (paged KV), or lower optim.prompts_per_step (e.g. --schedule quick){also}")
    rows = largest_fitting(cfg.optim.micro_batch_rows,
                           lambda r: memory_estimate(shape, cfg, gpu, r, gpus).total <= gpu)
    if rows:
        return f"set optim.micro_batch_rows={rows} (memory only: the gradient is the same){also}"
    return f"lower agent.vllm_gpu_memory_utilization or agent.max_context_tokens, or use a larger GPU{also}"


def check_wall_time(cfg: Config, tp: Throughput | None, gpus: int = 1) -> Check:
    if tp is None:
        return Check("wall time", "skip", "not measured (needs the GPU; or pass --decode-tps and --train-tps)",
                     required=False)
    w = workload(cfg, gpus)
    hours = run_seconds(w, tp.decode_tps, tp.train_tps) / 3600
    minutes = step_seconds(w, tp.decode_tps, tp.train_tps) / 60
    peak = f", peak {tp.peak_gib:.1f} GiB on the longest sample" if tp.peak_gib is not None else ""
    on = f" on {gpus} GPUs" if gpus > 1 else ""
    return Check("wall time", "ok", f"~{hours:.1f} h{on} for {w.steps} steps ({minutes:.1f} min/step) + evaluation, at "
                 f"{tp.decode_tps:,.0f} sampled and {tp.train_tps:,.0f} trained tokens/s ({tp.source}{peak}); "
                 f"assumes {w.gen_tokens_per_chain} sampled tokens per chain, {w.row_tokens} per row",
                 required=False)


def static_checks(cfg: Config, gpus: int = 1) -> tuple[list[Check], ModelShape | None]:
    """Every check that loads no model: CUDA, packages, model, data, retriever, memory estimate per rank of `gpus`."""
    memory = gpu_bytes()
    model, shape = check_model(cfg)
    checks = [check_cuda(cfg, memory), check_packages(cfg), model, check_data(cfg), check_retriever(cfg),
              check_memory(cfg, shape, memory, gpus)]
    return checks, shape


# ---- measurement on the device ---------------------------------------------------------------------

def measure_longest_sample(model: Any, vocab: int, rows: int, tokens: int, decode_rows: int = 32,
                           decode_tokens: int = 32) -> Throughput:
    """Forward + backward on `rows` x `tokens` random ids (the longest micro-batch: an OOM shows now),
    then a greedy decode of `decode_tokens` for `decode_rows` rows; tokens/s of each, and peak memory.
    Each is timed on its second run: the first pays CUDA's one-off start-up costs (kernel loading,
    cuBLAS workspaces), which on an H200 made the first greedy decode 3x slower."""
    import torch
    from tg.loss import token_logprobs
    dev = next(model.parameters()).device
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, tokens), generator=gen).to(dev)
    prompt = torch.randint(0, vocab, (decode_rows, 16), generator=gen).to(dev)

    def timed(fn: Any) -> float:
        fn()
        if cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    def train() -> None:
        token_logprobs(model(input_ids=ids).logits, ids).sum().backward()
        model.zero_grad(set_to_none=True)

    @torch.no_grad()
    def decode() -> None:
        model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=decode_tokens,
                       min_new_tokens=decode_tokens, do_sample=False)

    model.train()
    train_s = timed(train)
    model.eval()
    decode_s = timed(decode)
    peak = torch.cuda.max_memory_allocated(dev) / GIB if cuda else None
    return Throughput(decode_rows * decode_tokens / decode_s, rows * tokens / train_s,
                      "measured: HF decode, a lower bound for vLLM", peak)


def check_longest_sample(model: Any, cfg: Config, vocab: int) -> tuple[Check, Throughput | None]:
    """Run the longest micro-batch now; an out-of-memory becomes a failing check with its fix."""
    import torch
    from tg.gpu.estimate import longest_row_tokens
    rows, tokens = cfg.optim.micro_batch_rows, longest_row_tokens(cfg)
    try:
        tp = measure_longest_sample(model, vocab, rows, tokens, decode_rows=min(32, cfg.eval.batch_size))
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return Check("longest", "FAIL", f"out of memory on {rows} x {tokens} tokens",
                     fix=f"set optim.micro_batch_rows={max(1, rows // 2)}"), None
    peak = f", peak {tp.peak_gib:.1f} GiB" if tp.peak_gib is not None else ""
    return Check("longest", "ok", f"{rows} x {tokens} tokens: forward + backward fit{peak}"), tp


def check_gpus(gpus: int) -> None:
    """ConfigError for a GPU count outside 1 to MAX_GPUS."""
    if not 1 <= gpus <= MAX_GPUS:
        raise ConfigError(f"--gpus {gpus} is not a GPU count the estimates describe: give 1 to {MAX_GPUS} (the ranks "
                          "of one torchrun job)")


def run_preflight(cfg: Config, given: Throughput | None = None, measure: bool = True, gpus: int = 1) -> list[Check]:
    """All checks for `gpus` ranks; on a GPU (and `measure`) the starting policy is loaded and the longest sample run.
    Raises ConfigError for a GPU count outside 1 to MAX_GPUS."""
    check_gpus(gpus)
    checks, shape = static_checks(cfg, gpus)
    tp = given
    can_measure = measure and given is None and shape is not None and gpu_bytes() is not None
    can_measure = can_measure and not sharded(cfg, gpus)  # one GPU cannot hold what K ranks shard
    if can_measure and cfg.model.name_or_path != "tiny" and not any(c.failed for c in checks):
        from tg.agent.finetune import default_device, trainable_policy
        policy = trainable_policy(cfg.model.name_or_path, cfg.model, default_device())
        longest, tp = check_longest_sample(policy.model, cfg, shape.vocab)
        checks.append(longest)
    return checks + [check_wall_time(cfg, tp, gpus)]
