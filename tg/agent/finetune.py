"""What is trained: full fine-tuning, LoRA, or QLoRA (4-bit NF4 base + LoRA), on one code path.

`trainable_policy(path, cfg)` returns a `TrainablePolicy`: the model to optimise, its trainable
parameters, and a `reference_logits` that gives the frozen reference policy for the K3 KL term:
- LoRA / QLoRA: the base model with the adapter disabled (`disable_adapter()`): no second copy;
- full fine-tuning: a frozen copy of the starting weights (the paper's setting; twice the memory).
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from tg.config import ConfigError, ModelConfig
from tg.config_values import did_you_mean


def torch_dtype(cfg: ModelConfig, device: torch.device) -> torch.dtype:
    """float32 on CPU (bf16 is slower there), bfloat16 on CUDA, unless set explicitly."""
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, cfg.dtype)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class TrainablePolicy:
    """The policy under training and its frozen reference."""

    model: Any
    finetune: str
    reference: Any | None = None
    """Full fine-tuning only: the frozen starting model."""

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def reference_context(self) -> Any:
        """Context in which `self.reference_model` computes the reference policy."""
        return self.model.disable_adapter() if self.finetune != "full" else nullcontext()

    @property
    def reference_model(self) -> Any:
        return self.reference if self.finetune == "full" else self.model

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained weights only (the adapter for LoRA / QLoRA)."""
        if self.finetune == "full":
            return self.model.state_dict()
        from peft import get_peft_model_state_dict
        return get_peft_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if self.finetune == "full":
            self.model.load_state_dict(state)
        else:
            from peft import set_peft_model_state_dict
            set_peft_model_state_dict(self.model, state)


def dequantized_base(model: Any) -> dict[str, torch.Tensor]:
    """`model`'s 4-bit (QLoRA) base weights, dequantized as its layers compute with them, by checkpoint name.

    What a separate rollout engine must serve beneath the adapter: the checkpoint on disk holds the weights
    before NF4 rounding, which are not the trainer's policy. Empty when no layer is 4-bit."""
    try:
        import bitsandbytes as bnb
    except ImportError:
        return {}
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {f"{name.replace('.base_layer', '')}.weight": bnb.functional.dequantize_4bit(m.weight.data, m.weight.quant_state)
            for name, m in base.named_modules() if isinstance(m, bnb.nn.Linear4bit)}


def folded_lora(model: Any, into: Any | None = None) -> Any | None:
    """`model` (LoRA on a full-precision base) as a plain model whose adapted layers hold W + scale * B A, for
    sampling: one matmul per layer instead of three, and none of peft's per-layer Python. The same function up to
    float rounding (the trainer recomputes every log-prob it trains on; tests/test_engine.py bounds the difference).

    `into`: an earlier result for `model`, refreshed in place (the base is frozen: only the adapters moved).
    None when there is nothing to fold: full fine-tuning, or QLoRA (a 4-bit base is served as it computes)."""
    from peft.tuners.lora.layer import Linear as LoraLinear
    base = model.get_base_model() if hasattr(model, "get_base_model") else None
    layers = [(n, m) for n, m in base.named_modules() if isinstance(m, LoraLinear)] if base is not None else []
    if not layers or any(type(m.get_base_layer()) is not torch.nn.Linear or any(m.use_dora.values())
                         for _, m in layers):
        return None
    if into is None:
        return copy.deepcopy(model).merge_and_unload().eval().requires_grad_(False)
    with torch.no_grad():
        for name, m in layers:  # as peft's merge: the base weight plus each active adapter's delta, in turn
            w = m.get_base_layer().weight.clone()
            for adapter in m.active_adapters:
                w += m.get_delta_weight(adapter)
            into.get_submodule(name).weight.copy_(w)
    return into


def _load_base(path: str | Path, cfg: ModelConfig, device: torch.device) -> Any:
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    dtype = torch_dtype(cfg, device)
    kwargs: dict[str, Any] = dict(dtype=dtype)
    if cfg.finetune == "qlora":
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_compute_dtype=dtype)
        kwargs["device_map"] = {"": device.index or 0} if device.type == "cuda" else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    return model if cfg.finetune == "qlora" else model.to(device)


def _no_cpu_inference_packing(model: Any) -> None:
    """bitsandbytes repacks 4-bit weights for a CPU inference kernel the first time an eval-mode layer
    runs without grad; training through the repacked weights then fails (an in-place bias add on a
    leaf view). Rollouts and updates alternate, so keep one layout: the packing is switched off."""
    import bitsandbytes as bnb
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            m.support_avx512bf16_for_cpu = False


def check_lora_targets(model: torch.nn.Module, targets: Sequence[str]) -> None:
    """ConfigError, in one line naming the closest name, unless every entry of model.lora_targets names a linear layer
    of `model` (its last dotted part, as peft matches `target_modules`)."""
    linear = sorted({name.rpartition(".")[2] for name, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear)})  # bitsandbytes' Linear4bit is one too
    for t in targets:
        if t not in linear:
            raise ConfigError(f"config field `model.lora_targets` names {t!r}, no linear layer of the model"
                              f"{did_you_mean(t, linear)}; its linear layers: {', '.join(linear)}")


def trainable_policy(path: str | Path, cfg: ModelConfig, device: torch.device | None = None) -> TrainablePolicy:
    """Load the policy at `path` (a local directory or hub id) ready to train as `cfg.finetune` says."""
    device = device or default_device()
    model = _load_base(path, cfg, device)
    if cfg.finetune == "full":
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        reference = copy.deepcopy(model).eval().requires_grad_(False)
        return TrainablePolicy(model, "full", reference)
    from peft import LoraConfig, get_peft_model
    if cfg.finetune == "qlora":
        # Not peft's prepare_model_for_kbit_training: it casts the norms and embeddings to fp32, so every
        # activation runs in fp32 and attention cannot use the fused bf16 kernels. Qwen2's RMSNorm
        # already normalises in fp32; the LoRA weights stay fp32 (peft's default). On an H200 the cast
        # made the tiny policy's longest micro-batch run out of 140 GiB, and a Qwen2.5-1.5B-shaped update
        # 3x slower (bench/README.md, "On a GPU"). On CPU (fp32) nothing changes.
        _no_cpu_inference_packing(model)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    check_lora_targets(model, cfg.lora_targets)
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=list(cfg.lora_targets), task_type="CAUSAL_LM")
    return TrainablePolicy(get_peft_model(model, lora), cfg.finetune)
