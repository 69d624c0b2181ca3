"""The warmed-up starting policy of the cpu preset: pinned, checked, and rebuilt on demand.

The paper starts RL from a pretrained Qwen2.5 that can already follow the prompt; a random toy model cannot,
so the cpu preset's policy first imitates scripted episodes of the synthetic world (tg.agent.sft: the
demonstrations, the renaming that teaches it to read, the training loop). The results depend on a start's
exact weights, and a rebuilt warm-up differs by CPU kind (float order), so the two starts the results come
from are committed (`PINNED_DIR`, sha256 checked at every load: `warmed_up_policy`). `build_warmup` trains
another one into the cache, keyed by the hash of the model, data and warm-up config groups and by
`code_key()` (the recipe and the formats it depends on).

Departures from the paper: the warm-up itself (the paper has none; its models are pretrained).
"""

from __future__ import annotations

import hashlib
import json
import platform
import random
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from tg.agent.policy import CHAT_TEMPLATE, build_tiny_policy, save_policy
from tg.agent.protocol import build_prompt, format_observation
from tg.agent.retrieval import bm25_for
from tg.agent.sft import WARMUP_VERSION, demonstration, name_groups, pick_demonstrations, script, train
from tg.agent.world import WORLD_VERSION, ensure_world, load_world, resolve
from tg.config import Config, ConfigError
from tg.store.files import sha256_of

WARMUP_THREADS = 1
"""Torch threads for the warm-up, whatever the caller's: its floats depend on the thread count (and on the
CPU's kernels), so one count makes a rebuild repeatable on one machine."""


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block on `n` torch threads, then restore the caller's count (float results depend on it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


SAMPLE_ROW = {"relations": ["founder", "birthplace"], "hops": ["A", "B"], "chain": ["B", "C"]}
"""A two-hop question row whose script `code_key` hashes: a change in the scripts' wording changes the key."""


def code_key() -> str:
    """Hash of what shapes a warm-up besides its config: generator and recipe versions, the prompt,
    chat and observation formats. A change in any of them invalidates cached warm-ups."""
    sample = format_observation([{"id": "0", "title": "T", "contents": '"T"\nT is.'}])
    parts = [WARMUP_VERSION, WORLD_VERSION, build_prompt("q"), CHAT_TEMPLATE, sample, script(SAMPLE_ROW)]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:6]


def machine() -> str:
    """The CPU and torch's vector ISA, recorded beside a rebuilt warm-up (its floats depend on them)."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return f"{names[0] if names else platform.processor() or platform.machine()} (torch's ISA " \
           f"{torch.backends.cpu.get_cpu_capability()})"


PINNED_DIR = Path(__file__).parents[1] / "policies"
"""The committed starting policies (package data: a `pip install` gets them too), one directory each, named
as the warm-up they stand for (`warmup_dir`). Results depend on a start's exact weights, and a rebuilt
warm-up differs by CPU kind (float order), so every run loads these instead of rebuilding them."""

PINNED: dict[str, str] = {
    "warmup-fb4da30d3995-722e49": "00f7348b7b12418613eba3a1c0b547ca7fe953582d419260b3c086b3b01353cd",  # moderate
    "warmup-2f9bf1528d85-722e49": "b9ec9765a3073267aac90cfc77ae31b746474017276086f82e9438ed27372fbe",  # hard
}
"""Pinned directory name -> sha256 of its model.safetensors, checked at every load."""


class PolicyError(ConfigError):
    """A starting policy is missing or its weights are not the pinned bytes."""


def pinned_policy(name: str) -> Path:
    """The pinned policy `name`, after checking its weights' sha256 against `PINNED`."""
    path = PINNED_DIR / name
    got = sha256_of(path / "model.safetensors") if (path / "model.safetensors").exists() else "no file"
    if got != PINNED[name]:
        raise PolicyError(f"{path / 'model.safetensors'}: sha256 {got[:12]}, expected {PINNED[name][:12]}; the pinned "
                          "starting policy is damaged: restore it with `git checkout -- tg/policies`")
    return path


def warmup_dir(cfg: Config) -> Path:
    """Where a rebuilt warm-up lives: `<cache_dir>/warmup-<hash(model, data, warmup)>-<code_key()>/`."""
    return resolve(cfg.cache_dir) / f"warmup-{cfg.hash('model', 'data', 'warmup')}-{code_key()}"


def warmed_up_policy(cfg: Config) -> Path:
    """The directory of the warmed-up tiny policy (save_pretrained model + tokenizer): the pinned one of
    this config (hash checked), else one rebuilt earlier into the cache by `build_warmup`. Nothing is
    trained here: a config without either raises `PolicyError` naming the fix."""
    target = warmup_dir(cfg)
    if target.name in PINNED:
        return pinned_policy(target.name)
    if (target / "warmup.json").exists():
        return target
    raise PolicyError(f"no starting policy for this warm-up config ({target.name}): the pinned ones are the "
                      "cpu preset's two regimes (tg/policies). Build this one with `tg warmup --rebuild` "
                      "(with the same --set overrides; about 10 minutes on 2 cores), then rerun.")


def build_warmup(cfg: Config, target: Path | None = None, progress: bool = True) -> Path:
    """Train the warm-up of `cfg` now and save it to `target` (default: `warmup_dir(cfg)`, where
    `warmed_up_policy` finds it). Written atomically (a temporary directory, then a rename), so an
    interrupted run never leaves a half-written policy; `warmup.json` records losses and wall time."""
    target = Path(target) if target is not None else warmup_dir(cfg)
    t0 = time.perf_counter()
    world_path = ensure_world(cfg.data, cfg.cache_dir)
    world, retriever = load_world(world_path), bm25_for(world_path / "corpus.jsonl")
    model, tokenizer = build_tiny_policy(cfg.model, world, seed=cfg.warmup.seed)
    picked = pick_demonstrations(world, cfg.warmup)
    demos = [demonstration(q, tokenizer, retriever, cfg.data.top_k, early) for q, early in picked]
    short = [demonstration(q, tokenizer, retriever, cfg.data.top_k, early, instruction=False) for q, early in picked]
    cpu0 = time.process_time()
    with torch_threads(WARMUP_THREADS), torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.warmup.seed)
        losses = train(model, demos, cfg.warmup, tokenizer.pad_token_id, name_groups(world, tokenizer), short,
                       progress)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{random.randrange(1 << 30)}")
    save_policy(model, tokenizer, tmp)
    (tmp / "tg_config.json").write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))  # config.json is the model's
    record = {"losses": losses, "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - cpu0,
              "n_demos": len(demos),
              "demo_tokens": sum(len(d.ids) for d in demos), "world": str(world_path), "machine": machine(),
              "torch": torch.__version__}
    (tmp / "warmup.json").write_text(json.dumps(record))
    if target.exists():
        shutil.rmtree(target)   # asked for a rebuild: the new policy replaces the old one
    tmp.rename(target)
    return target
