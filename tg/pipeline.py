"""From a `Config` to the things a run needs: questions, retriever, environment, policy path.

The cpu preset builds the synthetic world and warms up the tiny policy (both cached on disk);
the paper presets read prepared NQ / HotpotQA files (`tg data prepare`) and a hub model, and
retrieve over HTTP from a Search-R1 style server or with BM25 over a local corpus.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tg.config import DataConfig, Config, ConfigError, ModelConfig
from tg.data import Question, load_split
from tg.env import SearchEnv
from tg.retrieval import CachedRetriever, bm25_for
from tg.server import HTTPRetriever
from tg.world import ensure_world, resolve

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""A model hub id, 'org/name' (bare legacy names such as 'gpt2' are taken for local paths)."""
SINGLE_SOURCES = ("synthetic_single", "nq", "triviaqa", "popqa")
"""Data sources averaged as single-hop (the paper's Table 1 left half)."""


@dataclass
class Resources:
    """Questions, retriever and environment of one config, and where its starting policy lives."""

    data_dir: Path
    train: list[Question]
    test: list[Question]
    retriever: Any
    policy_path: str

    def env(self, tokenizer: Any, cfg: Config) -> SearchEnv:
        return SearchEnv(tokenizer, self.retriever, top_k=cfg.data.top_k, max_obs_tokens=cfg.agent.max_obs_tokens,
                         max_turns=cfg.agent.max_turns)

    def test_sets(self, cfg: Config) -> tuple[list[Question], list[Question]]:
        """(single-hop, multi-hop) test questions: the first eval.n_single (eval.n_multi) of each data
        source, in file order; 0 = all of them."""
        single = [q for q in self.test if q.data_source in SINGLE_SOURCES]
        multi = [q for q in self.test if q.data_source not in SINGLE_SOURCES]
        return per_source(single, cfg.eval.n_single), per_source(multi, cfg.eval.n_multi)


def per_source(questions: list[Question], n: int) -> list[Question]:
    """The first `n` questions of each data source, order kept (n = 0: all)."""
    seen: Counter[str] = Counter()
    out = []
    for q in questions:
        if n == 0 or seen[q.data_source] < n:
            out.append(q)
            seen[q.data_source] += 1
    return out


def _data_dir(cfg: Config) -> Path:
    if cfg.data.source == "synthetic":
        return ensure_world(cfg.data, cfg.cache_dir)
    d = resolve(cfg.data.data_dir)
    if not d.exists():
        raise ConfigError(f"data.data_dir {str(d)!r} does not exist: run `tg data prepare --setting "
                          f"{cfg.data.setting} --out {cfg.data.data_dir}` first")
    return d


def _retriever(cfg: Config, data_dir: Path) -> Any:
    if cfg.data.retriever == "http":
        return HTTPRetriever(cfg.data.retriever_url)
    corpus = data_dir / "corpus.jsonl"
    if not corpus.exists():
        raise ConfigError(f"data.retriever = 'bm25' needs a corpus at {corpus} (JSONL with id and contents); "
                          "or set data.retriever = 'http' and data.retriever_url")
    return CachedRetriever(bm25_for(corpus))


def warmup_config(cfg: Config) -> Config:
    """The config that keys the tiny policy's warm-up: `cfg` less what RL does with the warmed-up model.

    The warm-up trains the whole float32 base model on both question kinds, so how RL later fine-tunes it
    (full / LoRA / QLoRA), the dtype it is loaded in and the setting it trains on key no separate warm-up
    (a bf16 QLoRA smoke run on a GPU reuses the CPU machine's cache). Its demonstrations always search the
    world's corpus with in-process BM25, so where RL retrieves (`data.retriever`, `data.retriever_url`) keys
    none either; `data.top_k` does (the demonstrations show that many documents)."""
    d, data = ModelConfig(), DataConfig()
    return cfg.replace(model=dict(finetune=d.finetune, dtype=d.dtype, lora_r=d.lora_r, lora_alpha=d.lora_alpha,
                                  lora_dropout=d.lora_dropout, lora_targets=d.lora_targets,
                                  gradient_checkpointing=d.gradient_checkpointing),
                       data=dict(setting=data.setting, retriever=data.retriever, retriever_url=data.retriever_url))


def _policy_path(cfg: Config) -> str:
    if cfg.model.name_or_path != "tiny":
        return cfg.model.name_or_path
    if not cfg.warmup.enabled:
        raise ConfigError("model.name_or_path = 'tiny' needs warmup.enabled = true (a random tiny model "
                          "cannot follow the protocol)")
    from tg.warmup import warmed_up_policy
    return str(warmed_up_policy(warmup_config(cfg)))


def policy_source(policy: str) -> tuple[str | None, Path | None]:
    """What `tg eval --policy` names, as (model path or hub id, checkpoint): a run directory (its
    `checkpoint.pt`, on the config's starting policy), a checkpoint file, a saved model directory
    (`config.json`), or a hub id. Anything else (a path, or 'runs/...' or 'DIR/...' for an existing DIR,
    that holds none of them) raises `PolicyError` at once, before anything loads or reaches the hub."""
    from tg.warmup import PolicyError
    path = Path(policy).expanduser()
    if (path / "checkpoint.pt").is_file():
        return None, path / "checkpoint.pt"
    if path.is_file() and path.suffix == ".pt":
        return None, path
    if (path / "config.json").is_file():
        return str(path), None
    head = policy.split("/", 1)[0]
    if path.exists() or not HUB_ID.fullmatch(policy) or head == "runs" or Path(head).is_dir():
        raise PolicyError(f"no run directory or checkpoint at {policy}: pass a run directory holding checkpoint.pt "
                          "(runs/<method>-<hash>, written by `tg train`), a checkpoint.pt file, a model directory "
                          "holding config.json (save_pretrained), or a hub id such as Qwen/Qwen2.5-1.5B")
    return policy, None


def load_resources(cfg: Config) -> Resources:
    """Build or load everything the config names (world, index, warmed-up policy are cached)."""
    d = _data_dir(cfg)
    return Resources(d, load_split(d, "train"), load_split(d, "test"), _retriever(cfg, d), _policy_path(cfg))
