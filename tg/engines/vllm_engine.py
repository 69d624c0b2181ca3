"""The vLLM engine: the `Engine` interface of `tg.engines.engine` on vLLM, with automatic prefix caching.

    engine = VLLMEngine("runs/policy", tokenizer, lora=True)
    batch = engine.open(contexts, counts, sampling)        # as every engine (tg/engines/engine.py)
    diff = engine.sync(peft_model, probe_ids)               # after each optimiser step: serve + check
    # = engine.load_adapter(peft_model or adapter_dir); engine.check_sync(probe_ids, trainer_logprobs)

How rows, the budget ledger, token ids, log-probs and seeds map onto vLLM: tg.engines.vllm_batch.

1. Policy sync: LoRA adapters load under a new `lora_int_id` per version (reusing an id after
   overwriting the files serves the OLD weights, silently); full weights reload in place
   (`reload_weights`). Both reset the prefix cache. vLLM serves LoRA only on the decoder's linear
   layers: an adapter on `lm_head` or the embeddings is refused with a message. QLoRA: vLLM 0.32 has no
   bitsandbytes; the trainer's NF4 base, dequantized, is loaded in place of model_dir's weights at the first
   sync (the trainer syncs before its first rollout too), so the adapter sits on the base it was trained on.
2. In-process start-up (multiprocessing=False) works around two process-wide effects of vLLM 0.32's
   CPU worker: it crashes scanning llvmlite's module (imported via bm25s -> numba), and it replaces
   `torch.set_num_threads` with a no-op; see tg.engines.vllm_setup and `__init__`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from tg.agent.finetune import dequantized_base
from tg.engines.engine import Sampling, StopChecker
from tg.engines.kvcache import PrefixStore
from tg.engines.vllm_batch import VLLMBatch
from tg.engines.vllm_setup import (CPU_HEAD_DIMS, VLLMSetupError, import_vllm, modules_hidden_from_vllm_scan,
                                   startup_hint)

log = logging.getLogger(__name__)

SYNC_TOL = {"float32": 1e-3, "bfloat16": 0.25}
"""Default `check_sync` tolerance by the engine's dtype. fp32 agrees to ~1e-6 on CPU (tests). In bf16, vLLM's CPU
kernels and transformers' round differently: on the warmed-up cpu policy with a random LoRA r=16 adapter
(B ~ N(0, 0.02), 20 prompts of ~114 tokens) the largest |d logprob| is 0.09-0.16 with LoRA and 0.17 with QLoRA;
tests/test_vllm_engine.py checks it. bf16 has not been measured on a GPU. The price: at 0.25 the check catches
only gross mismatches, such as an adapter not served once it moves log-probs that far (that random adapter moves
them by 1.8-2.7; an adapter a few small steps from zero much less), not a subtly different base like the
unquantized one under a QLoRA adapter (0.0855 in fp32). scripts/gpu_smoke.sh prints the measured
`sync_maxdiff`."""
LORA_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Qwen2 modules vLLM can serve LoRA on."""


class PolicySyncError(RuntimeError):
    """The engine does not serve the trainer's current policy (probe log-probs differ past tolerance)."""


class VLLMEngine:
    """Step-wise generation with vLLM (prefix caching on), LoRA or full-weight policy sync, a sync check.

    model_dir:            a `save_pretrained` directory (or hub id on a machine that reaches the hub).
    tokenizer:            the policy's HF tokenizer; saved beside the engine so vLLM detokenizes the same.
    lora:                 serve LoRA adapters (`load_adapter`); without it, `load_weights` syncs.
    max_lora_rank:        the largest adapter rank `load_adapter` accepts (vLLM sizes LoRA buffers by it).
    max_model_len:        longest context + step in tokens; None = the model's max_position_embeddings.
    kv_cache_space_gib:   CPU: KV cache size (vLLM's auto size fails a NUMA memory check on small hosts).
    gpu_memory_utilization: GPU: fraction of GPU memory for weights + activations + KV cache.
    block_size:           KV block in tokens; prefix reuse works in whole blocks (CPU needs a multiple of 32).
    seed:                 `LLM(seed=...)`: seeds vLLM's generators at start-up (a CPU engine with
                          multiprocessing=True samples from that one stream; tg.engines.vllm_batch, 5).
    dtype:                'auto' = float32 on CPU, bfloat16 on GPU (as tg.agent.policy.resolve_dtype).
    data_parallel_size:   under torchrun with that many ranks: one engine per rank on its own GPU, each
                          sampling its own rows (vLLM's `external_launcher` data-parallel mode; GPU only).
    enforce_eager:        no torch.compile / CUDA graphs: `LLM()` ~3 s instead of 30-90 s on CPU.
    multiprocessing:      run vLLM's engine core in a subprocess (its default); False keeps it in-process:
                          on CPU ~4 s to start instead of ~35 s, no `if __name__ == "__main__"` guard, and
                          no crash when __main__ imports numba (bm25s does; see tg.engines.vllm_setup).
    entropies:            report `GenOut.entropies`, exactly, from the full log-prob vector of every sampled
                          position: O(vocabulary) work per token (tg.engines.vllm_batch, 4). False: left empty.
    """

    def __init__(self, model_dir: str | Path, tokenizer: Any, *, lora: bool = False, max_lora_rank: int = 16,
                 max_model_len: int | None = None, kv_cache_space_gib: float = 1.0,
                 gpu_memory_utilization: float = 0.5, block_size: int = 32, seed: int = 0, dtype: str = "auto",
                 data_parallel_size: int = 1, enforce_eager: bool = True, multiprocessing: bool = False,
                 log_level: str = "WARNING", entropies: bool = False) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
        vllm = import_vllm()
        from vllm.platforms import current_platform

        logging.getLogger("vllm").setLevel(log_level)
        self.on_cpu = current_platform.is_cpu()
        self.tokenizer, self.lora, self.multiprocessing, self.entropies = tokenizer, lora, multiprocessing, entropies
        self.stop = StopChecker(tokenizer)
        self._dir = Path(tempfile.mkdtemp(prefix="tg-vllm-"))
        tokenizer.save_pretrained(self._dir / "tokenizer")
        if (Path(model_dir) / "config.json").exists():  # else vLLM retries to read it there for 2 s
            shutil.copy(Path(model_dir) / "config.json", self._dir / "tokenizer")
        self._check_model(Path(model_dir), block_size)
        self.dtype = self._dtype(dtype)
        kw: dict[str, Any] = dict(
            tokenizer=str(self._dir / "tokenizer"), dtype=self.dtype, seed=seed, block_size=block_size,
            enable_prefix_caching=True, enforce_eager=enforce_eager, max_model_len=max_model_len,
            logprobs_mode="raw_logprobs", max_logprobs=-1 if entropies else 20,
            generation_config="vllm")  # no sampling defaults from generation_config.json: ours are explicit
        if self.on_cpu:
            if "VLLM_CPU_KVCACHE_SPACE" in os.environ:
                log.warning("VLLM_CPU_KVCACHE_SPACE=%s overrides kv_cache_space_gib=%s",
                            os.environ["VLLM_CPU_KVCACHE_SPACE"], kv_cache_space_gib)
            kw["kv_cache_memory_bytes"] = int(kv_cache_space_gib * 2**30)
        else:
            kw["gpu_memory_utilization"] = gpu_memory_utilization
        if data_parallel_size > 1:
            kw.update(data_parallel_size=data_parallel_size, distributed_executor_backend="external_launcher")
        if lora:
            kw.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1, max_cpu_loras=1)
        self.max_lora_rank = max_lora_rank
        set_num_threads = torch.set_num_threads
        try:
            with modules_hidden_from_vllm_scan():
                self.llm = vllm.LLM(str(model_dir), **kw)
        except Exception as e:
            hint = startup_hint(e, kv_cache_space_gib if self.on_cpu else None, block_size)
            if hint is None:
                raise
            raise VLLMSetupError(f"vLLM failed to start: {hint}. (vLLM said: {str(e)[:400]})") from e
        finally:
            # The CPU worker replaces torch.set_num_threads process-wide with a no-op that warns; a
            # trainer in the same process must keep control of its threads.
            torch.set_num_threads = set_num_threads
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self.lora_request: Any = None
        """The adapter every request uses (None = the base weights)."""
        self.version = 0
        """Policy version: bumped by every load_adapter / load_weights."""
        self._base_served = False
        """lora=True: whether `sync` has loaded the trainer's base (a QLoRA model's differs from model_dir's)."""

    def _dtype(self, dtype: str) -> str:
        return ("float32" if self.on_cpu else "bfloat16") if dtype == "auto" else dtype

    def _check_model(self, model_dir: Path, block_size: int) -> None:
        """Refuse, with the setting to change, what vLLM's CPU backend would reject deep inside."""
        if not self.on_cpu:
            return
        if block_size % 32:
            raise VLLMSetupError(f"block_size={block_size}: the CPU attention backend needs a multiple of 32 (use 32)")
        cfg_path = model_dir / "config.json"
        if cfg_path.exists():
            cfg = json.loads(cfg_path.read_text())
            head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
            if head not in CPU_HEAD_DIMS:
                raise VLLMSetupError(f"head size {head} (hidden_size / num_attention_heads) is not supported by "
                                     f"vLLM's CPU attention ({CPU_HEAD_DIMS}): change model.hidden_size or "
                                     "model.num_heads (the cpu preset's 128 / 4 = 32 works)")

    # ---- the Engine interface ----------------------------------------------------------------
    def open(self, contexts: Sequence[Sequence[int]], counts: Sequence[int], sampling: Sampling,
             prefixes: PrefixStore | None = None) -> VLLMBatch:
        """`prefixes` is not needed: vLLM's automatic prefix caching finds shared prefixes by itself."""
        return VLLMBatch(self, contexts, counts, sampling)

    @property
    def per_request_seeds(self) -> bool:
        """Whether sampled requests carry their own seed (not on CPU: tg.engines.vllm_batch, 5)."""
        return not self.on_cpu

    def run(self, prompts: Sequence[Sequence[int]], params: Sequence[Any], seed: int | None = None) -> list[Any]:
        """One `LLM.generate` over token-id prompts with the current policy; RequestOutputs in order.

        seed: for unseeded requests of an in-process engine, torch's global generator is seeded with it
        for this call and restored afterwards; None leaves the generator alone.
        """
        from vllm.inputs import TokensPrompt

        too_long = [len(p) for p in prompts if len(p) >= self.max_model_len]
        if too_long:
            raise VLLMSetupError(f"a context of {max(too_long)} tokens does not fit max_model_len="
                                 f"{self.max_model_len}: raise `max_model_len` or cap agent.max_context_tokens")
        seeded = seed is not None and not self.multiprocessing
        with torch.random.fork_rng(devices=[]) if seeded else contextlib.nullcontext():
            if seeded:
                torch.manual_seed(seed)
            return self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], list(params),
                                     use_tqdm=False, lora_request=self.lora_request)

    # ---- policy sync ---------------------------------------------------------------------------
    def load_adapter(self, adapter: str | Path | Any) -> int:
        """Serve a LoRA adapter (a peft `save_pretrained` directory, or a PeftModel saved here first).

        Loads it under a new lora_int_id (= the new policy version), evicts the previous one and
        resets the prefix cache. Returns the version.
        """
        if not self.lora:
            raise VLLMSetupError("load_adapter needs VLLMEngine(..., lora=True); "
                                 "full fine-tuning syncs with load_weights")
        from vllm.lora.request import LoRARequest

        version = self.version + 1
        path = Path(adapter) if isinstance(adapter, (str, Path)) else self._dir / f"adapter-v{version}"
        if not isinstance(adapter, (str, Path)):
            adapter.save_pretrained(path)
        self._check_adapter(path)
        self.unload_adapter()  # evicts the previous version (max_loras=1)
        request = LoRARequest(f"policy-v{version}", version, str(path))
        self.llm.llm_engine.add_lora(request)  # loads now, so a bad adapter fails here and not mid-rollout
        self.lora_request, self.version = request, version
        return version

    def unload_adapter(self) -> int:
        """Serve the base weights again (new policy version, prefix cache reset)."""
        if self.lora_request is not None:
            self.llm.llm_engine.remove_lora(self.lora_request.lora_int_id)
            shutil.rmtree(self._dir / f"adapter-v{self.lora_request.lora_int_id}", ignore_errors=True)
            self.lora_request = None
        self.version += 1
        self.reset_prefix_cache()
        return self.version

    def _check_adapter(self, path: Path) -> None:
        cfg = json.loads((path / "adapter_config.json").read_text())
        targets = cfg.get("target_modules") or []
        targets = [targets] if isinstance(targets, str) else list(targets)
        bad = [t for t in targets if t.split(".")[-1] not in LORA_LAYERS] + list(cfg.get("modules_to_save") or [])
        if bad:
            raise VLLMSetupError(f"adapter {path} adapts {bad}: vLLM serves LoRA only on {LORA_LAYERS}. Drop them "
                                 "from model.lora_targets, or fine-tune fully and sync with load_weights")
        if int(cfg.get("r", 0)) > self.max_lora_rank:
            raise VLLMSetupError(f"adapter rank {cfg['r']} > max_lora_rank={self.max_lora_rank}: raise max_lora_rank")

    def load_weights(self, weights: Mapping[str, torch.Tensor] | str | Path) -> int:
        """Reload the base weights in place (full fine-tuning): an HF-named state dict or a
        `save_pretrained` directory (its *.safetensors). Resets the prefix cache; returns the new version.

        With tied embeddings vLLM 0.32's in-place reload takes the shared matrix from `lm_head.weight`
        and silently ignores `model.embed_tokens.weight`; a checkpoint of a tied model has only the
        latter, so it is passed under both names.
        """
        if isinstance(weights, (str, Path)):
            from safetensors.torch import load_file

            files = sorted(Path(weights).glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors in {weights}")
            weights = {k: v for f in files for k, v in load_file(f).items()}
        named = {k: v.detach() for k, v in weights.items()}
        if "lm_head.weight" not in named and "model.embed_tokens.weight" in named:
            named["lm_head.weight"] = named["model.embed_tokens.weight"]
        if self.multiprocessing:  # tensors do not cross vLLM's worker RPC: hand over a file
            from safetensors.torch import save_file

            (self._dir / "weights").mkdir(exist_ok=True)
            tensors = {k: v.contiguous().clone() for k, v in named.items()}  # clone: tied tensors share storage
            save_file(tensors, self._dir / "weights" / "model.safetensors")
            kwargs: dict[str, Any] = {"weights_path": str(self._dir / "weights")}
        else:
            kwargs = {"weights_iterator": list(named.items())}
        self.llm.collective_rpc("reload_weights", kwargs=kwargs)
        self.version += 1
        self.reset_prefix_cache()
        return self.version

    def sync(self, model: torch.nn.Module, probe_ids: Sequence[int] | None = None, tol: float | None = None
             ) -> float | None:
        """Serve `model` (before the first rollout, and after each optimiser step): its adapter if lora=True
        (over its base as the trainer computes with it: a QLoRA model's dequantized 4-bit weights, loaded
        the first time), else its full weights; then, given a probe, `check_sync` it against `model` and
        return the max |d logprob|."""
        if self.lora:
            if not self._base_served:
                base = dequantized_base(model)
                if base:
                    self.load_weights(base)
                self._base_served = True
            self.load_adapter(model)
        else:
            self.load_weights(model.state_dict())
        return None if probe_ids is None else self.check_sync(probe_ids, probe_logprobs(model, probe_ids), tol)

    def reset_prefix_cache(self) -> None:
        """Drop every cached block (they hold KV of the previous policy)."""
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running)")

    def prompt_logprobs(self, ids: Sequence[int]) -> list[float]:
        """log p(ids[i] | ids[:i]) for i >= 1 under the served policy (a full recompute: vLLM skips the
        prefix cache for prompt log-probs). len(ids) - 1 values."""
        from vllm import SamplingParams

        out = self.run([ids], [SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)])[0]
        return [out.prompt_logprobs[i][t].logprob for i, t in enumerate(ids) if i > 0]

    def check_sync(self, probe_ids: Sequence[int], expected_logprobs: Sequence[float], tol: float | None = None
                   ) -> float:
        """Max |log-prob difference| between the served policy and the trainer's on a fixed probe.

        expected_logprobs: the trainer's log p(probe_ids[i] | probe_ids[:i]), i >= 1 (see `probe_logprobs`).
        Raises PolicySyncError past `tol`; None: `SYNC_TOL` of the engine's dtype (fp32 on CPU agrees to ~1e-6).
        """
        tol = SYNC_TOL[self.dtype] if tol is None else tol
        got = self.prompt_logprobs(probe_ids)
        if len(got) != len(expected_logprobs):
            raise ValueError(f"expected_logprobs has {len(expected_logprobs)} values; the probe needs {len(got)}")
        diff = max(abs(a - b) for a, b in zip(got, expected_logprobs))
        if diff > tol:
            raise PolicySyncError(f"vLLM serves a policy other than the trainer's: max |d logprob| = {diff:.3g} > "
                                  f"tol {tol} on {len(got)} probe tokens (engine policy version {self.version}). "
                                  "Call load_adapter / load_weights after each optimiser step.")
        return diff

    def close(self) -> None:
        """Free the engine (vLLM holds its KV cache until the LLM object is gone)."""
        shutil.rmtree(self._dir, ignore_errors=True)
        self.llm = None


@torch.no_grad()
def probe_logprobs(model: torch.nn.Module, ids: Sequence[int]) -> list[float]:
    """The trainer's side of `check_sync`: log p(ids[i] | ids[:i]), i >= 1, by one full forward."""
    device = next(model.parameters()).device
    logits = model(torch.tensor([list(ids)], device=device)).logits[0].float()  # [T, V]
    logp = torch.log_softmax(logits[:-1], -1)
    return logp.gather(-1, torch.tensor(ids[1:], device=device)[:, None])[:, 0].tolist()


