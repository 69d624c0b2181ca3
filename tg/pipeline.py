"""From a `Config` to a trained and evaluated run: the library API that the CLI, the experiments and the
notebooks share (`load_resources`, `build_run`, `train_and_evaluate`, `evaluate_model`).

The cpu preset builds the synthetic world and warms up the tiny policy (both cached on disk);
the paper presets read prepared NQ / HotpotQA files (`tg data prepare`) and a hub model, and
retrieve over HTTP from a Search-R1 style server or with BM25 over a local corpus.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from tg.agent.data import Question, is_single_hop
from tg.agent.env import Environment
from tg.agent.finetune import default_device, trainable_policy
from tg.agent.retrieval import CachedRetriever, bm25_for
from tg.agent.server import HTTPRetriever
from tg.agent.tasks import make_env, task_questions
from tg.agent.world import MULTI, SINGLE, ensure_world, resolve
from tg.config import Config, ConfigError, DataConfig, ModelConfig
from tg.config_groups import SMOL_NAME
from tg.engines.engine import Engine, HFEngine
from tg.evaluate import EvalResult, evaluate
from tg.gpu.distributed import Parallel
from tg.trainer import Trainer

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""A model hub id, 'org/name' (bare legacy names such as 'gpt2' are taken for local paths)."""


@dataclass
class Resources:
    """Questions, retriever and environment of one config (its task: agent.env), and where its starting policy lives."""

    data_dir: Path
    train: list[Question]
    test: list[Question]
    retriever: Any
    """The search task's retriever (None for the calculator)."""
    policy_path: str

    def env(self, tokenizer: Any, cfg: Config) -> Environment:
        return make_env(cfg, tokenizer, self.retriever)

    def train_set(self, cfg: Config) -> list[Question]:
        """The training questions of the config's setting: the synthetic world's train split holds both kinds
        (its sources name theirs); a prepared train file is one setting already (all of it)."""
        single = cfg.data.setting == "single-hop"
        return [q for q in self.train if q.data_source not in (SINGLE, MULTI) or is_single_hop(q.data_source) == single]

    def test_sets(self, cfg: Config) -> tuple[list[Question], list[Question]]:
        """(single-hop, multi-hop) test questions: the first eval.n_single (eval.n_multi) of each data
        source, in file order; 0 = all of them."""
        single = [q for q in self.test if is_single_hop(q.data_source)]
        multi = [q for q in self.test if not is_single_hop(q.data_source)]
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
    if cfg.model.name_or_path == SMOL_NAME:
        from tg.agent.smol import smol_policy
        return str(smol_policy(warmup_config(cfg)))
    if cfg.model.name_or_path != "tiny":
        return cfg.model.name_or_path
    if not cfg.warmup.enabled:
        raise ConfigError("model.name_or_path = 'tiny' needs warmup.enabled = true (a random tiny model "
                          "cannot follow the protocol)")
    from tg.agent.warmup import warmed_up_policy
    return str(warmed_up_policy(warmup_config(cfg)))


def policy_source(policy: str) -> tuple[str | None, Path | None]:
    """What `tg eval --policy` names, as (model path or hub id, checkpoint): a run directory (itself: its newest
    readable checkpoint, `tg.store.rundir.read_trained`, on the config's starting policy), a checkpoint file, a
    saved model directory (`config.json`), or a hub id. Anything else (a path, or 'runs/...' or 'DIR/...' for an
    existing DIR, that holds none of them) raises `PolicyError` at once, before anything loads or reaches the hub."""
    from tg.agent.warmup import PolicyError
    from tg.store.rundir import has_checkpoint
    path = Path(policy).expanduser()
    if path.is_dir() and has_checkpoint(path):
        return None, path
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
    retriever = _retriever(cfg, d) if cfg.agent.env == "search" else None
    return Resources(d, *task_questions(cfg, d), retriever, _policy_path(cfg))


@dataclass
class Run:
    """A trainer, the resources it was built from and its tokenizer."""

    trainer: Trainer
    resources: Resources
    tokenizer: Any


def build_run(cfg: Config, run_dir: str | Path, parallel: Parallel | None = None) -> Run:
    """Load questions, retriever and the starting policy; save the config into the run directory (rank 0)."""
    from transformers import AutoTokenizer
    par = parallel or Parallel(cfg.optim.rollout_shards)
    res = load_resources(cfg)
    torch.manual_seed(cfg.optim.seed)  # LoRA initialisation (the same on every rank)
    policy = trainable_policy(res.policy_path, cfg.model, default_device())
    tok = AutoTokenizer.from_pretrained(res.policy_path)
    if par.is_main:
        cfg.save(run_dir)
    engine = vllm_engine(cfg, res.policy_path, tok, par.world) if cfg.agent.engine == "vllm" else None
    return Run(Trainer(cfg, policy, tok, res.env(tok, cfg), res.train_set(cfg), run_dir, engine, par), res, tok)


def vllm_engine(cfg: Config, policy_path: str, tokenizer: Any, ranks: int = 1) -> Any:
    """A vLLM engine on the starting weights (the trainer syncs it after every step); with several ranks,
    one per rank on its own GPU (vLLM's torchrun data-parallel mode)."""
    from tg.engines.vllm_engine import VLLMEngine
    return VLLMEngine(policy_path, tokenizer, lora=cfg.model.finetune != "full", max_lora_rank=cfg.model.lora_r,
                      kv_cache_space_gib=cfg.agent.vllm_kv_cache_gib,
                      gpu_memory_utilization=cfg.agent.vllm_gpu_memory_utilization, seed=cfg.optim.seed,
                      dtype=cfg.model.dtype, data_parallel_size=ranks,  # dtype: the trainer's, as the sync check
                      entropies=cfg.tree.node_rule == "entropy")  # the 'entropy' rule needs them (O(V) per token)


def evaluate_model(model: Any, tokenizer: Any, res: Resources, cfg: Config, progress: bool = True,
                   engine: Engine | None = None, parallel: Parallel | None = None) -> EvalResult:
    """Greedy EM on the config's single-hop and multi-hop test sets, on `engine` (default: the HF engine on
    `model`). Over several ranks each evaluates its contiguous share and every rank gets the whole result."""
    par = parallel or Parallel()
    single, multi = res.test_sets(cfg)
    questions = single + multi
    share = -(-len(questions) // par.world)
    mine = questions[par.rank * share:(par.rank + 1) * share]
    model.eval()
    result = evaluate(engine or HFEngine(model, tokenizer), res.env(tokenizer, cfg), tokenizer, mine,
                      batch_size=cfg.eval.batch_size, max_step_tokens=cfg.agent.max_step_tokens,
                      max_context_tokens=cfg.agent.max_context_tokens, progress=progress and par.is_main)
    return EvalResult.concat(par.gather(result)) if par.world > 1 else result


def evaluate_run(run: Run, cfg: Config, progress: bool = True) -> EvalResult:
    """`evaluate_model` on the run's policy, on its rollout engine (vLLM when agent.engine=vllm), over its ranks."""
    tr = run.trainer
    engine = tr.engine if cfg.agent.engine == "vllm" else None
    with tr.par.rollout_context(tr.policy):
        return evaluate_model(tr.policy.model, run.tokenizer, run.resources, cfg, progress, engine, tr.par)


def train_and_evaluate(run: Run, cfg: Config, points: Sequence[int], resume: bool,
                       progress: bool = True) -> Iterator[tuple[int, list[dict], EvalResult]]:
    """Train to each evaluation point in turn and evaluate there: yields (step, metrics so far, result).

    The first segment resumes from the run's checkpoint if `resume`; later ones continue from the
    checkpoint `fit` writes at every segment's end (the same state, so results equal one long run)."""
    for i, p in enumerate(points):
        metrics = run.trainer.fit(steps=p, resume=resume or i > 0, progress=progress)
        if run.trainer.step_done != p:
            raise ConfigError(f"the checkpoint in {run.trainer.run_dir} is at step {run.trainer.step_done}, past the "
                              f"evaluation point {p}: delete that directory to rerun from the start")
        yield p, metrics, evaluate_run(run, cfg, progress=progress)


def default_run_dir(cfg: Config) -> Path:
    kind = "chain" if cfg.tree.is_chain else "tree"
    return resolve("runs") / f"{kind}-{cfg.hash()}"


def method_name(cfg: Config) -> str:
    t = cfg.tree
    if t.is_chain:
        return f"chain GRPO (G={t.M})"
    return f"Tree-GRPO ({t.M},{t.N},{t.L}) {cfg.optim.advantage}"
