"""Chain GRPO and Tree-GRPO training: the one place that wires rollouts, rewards, advantages and the loss
(paper §3.2, Table 5). On one device; over several ranks through a `tg.gpu.distributed.Parallel`, whose hooks
(prompt shards, gradient reduction, gathered metrics, full checkpoints) leave the math here unchanged.

One step:
1. take the next `prompts_per_step` training questions (a seeded permutation per epoch);
2. roll out M trees per question (chains: M = G, N = L = 0) with the engine and the environment
   (tg.agent.env.Environment; the search tool by default);
3. score every leaf with the reward (tg.agent.env.Reward; Eq. 13 by default), compute advantages (Eq. 5-7;
   chains: plain GRPO by prompt, plus GiGPO's step-group advantage per step with `optim.step_groups`,
   tg.advantage.step_group_advantages);
4. one training row per leaf: its exact sampled ids and observation mask (shared prefixes repeat;
   with `optim.pack_trees` each tree's rows run as one sequence along their shared prefixes; a
   micro-batch's common start, the prompt's instructions, runs once for all its rows; tg.batch, tg.packing);
5. old log-probs once, reference log-probs once (adapter disabled), then PPO mini-batches of
   `mini_batch_prompts` questions, with gradient accumulation over `micro_batch_rows` rows, AdamW,
   linear warm-up then constant LR, grad-norm clip.

Metrics: one JSONL row per step (tg.metrics.METRICS, also in docs/cli.md).
Deviations, numbered:
1. With one mini-batch per step the old log-probs equal the current ones before the update, so
   they are taken from the update's own forward (detached): one forward saved, same numbers.
   With several mini-batches they are computed once, before the first update.
2. Micro-batch losses are weighted by their share of the mini-batch (rows for seq-mean, policy
   tokens for token-mean), so accumulation gives exactly the mini-batch aggregate; the official
   code divides by the number of accumulation steps.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from tg.agent.contract import CheckedEnv
from tg.agent.data import Question
from tg.agent.env import Environment, Reward
from tg.agent.finetune import TrainablePolicy
from tg.agent.protocol import prompt_ids
from tg.agent.tasks import make_reward
from tg.batch import Micro, Rows, build_rows, check_replaceable, leaf_advantages, leaf_rewards, micro_batches
from tg.budget import Ledger, ledgers
from tg.config import Config
from tg.engines.engine import Engine, HFEngine, Sampling
from tg.gpu.distributed import Parallel, failures_as_rank_lost, gather_step, set_rng_state, shard_seed, shard_slices
from tg.loss import entropy, grpo_loss, logprobs_at
from tg.memory import keep_freed_memory
from tg.metrics import step_metrics
from tg.packing import packed_logits
from tg.progress import tqdm
from tg.store.files import atomic_write_text
from tg.store.rundir import check_trained_as, has_checkpoint, read_checkpoint, run_lock, write_checkpoint
from tg.tree import RolloutStats, Tree, sample_trees

logger = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """A loss, gradient or trained weight is NaN/inf: the step is stopped and no checkpoint is written."""


def rollout_seed(seed: int, step: int) -> int:
    """The seed of step `step`'s rollout (sampling and node choice) in a run seeded `seed`."""
    return seed * 1_000_003 + step


def sample_batch(engine: Engine, env: Environment, questions: Sequence[Question], cfg: Config,
                 seed: int) -> tuple[list[list[Tree]], RolloutStats]:
    """The training rollout: cfg.tree's (M, N, L) trees per question at the agent's temperature and top-p. A prompt
    that fills agent.max_context_tokens samples nothing, so its question trains on nothing: logged as a warning."""
    t, a = cfg.tree, cfg.agent
    prompts = [env.prompt_ids(q.question) for q in questions]
    if full := [len(p) for p in prompts if len(p) >= a.max_context_tokens]:
        logger.warning("%d of %d questions have prompts of %d+ tokens, filling agent.max_context_tokens = %d: they "
                       "sample nothing and train on nothing (raise agent.max_context_tokens or shorten them)",
                       len(full), len(prompts), min(full), a.max_context_tokens)
    return sample_trees(engine, env, prompts, M=t.M, N=t.N, L=t.L,
                        node_rule=t.node_rule, rng=random.Random(seed), sampling=Sampling(a.temperature, a.top_p, seed),
                        max_step_tokens=a.max_step_tokens, max_context_tokens=a.max_context_tokens)


def _at_policy(values: torch.Tensor, mb: Micro) -> torch.Tensor:
    """[B, width]: `values` [N] at the micro-batch's policy tokens, 0 elsewhere (differentiable)."""
    r, c = (x.to(values.device) for x in mb.policy)
    return values.new_zeros(mb.ids.shape).index_put((r, c), values)


def _set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """Owns the policy, optimiser, schedule, data position and checkpoints of one run."""

    def __init__(self, cfg: Config, policy: TrainablePolicy, tokenizer: Any, env: Environment,
                 questions: Sequence[Question], run_dir: str | Path, engine: Engine | None = None,
                 parallel: Parallel | None = None, reward_fn: Reward | None = None) -> None:
        self.cfg, self.policy, self.tokenizer, self.env = cfg, policy, tokenizer, env
        keep_freed_memory()  # a step's large tensors reuse freed memory, no fresh pages (tg.memory)
        self.reward_fn = reward_fn or make_reward(cfg)
        """Scores each leaf (tg.agent.env.Reward); default: the config's task's (tg.agent.tasks.make_reward)."""
        self.questions = list(questions)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        o = cfg.optim
        self.par = parallel or Parallel(o.rollout_shards)
        self.train_model = self.par.prepare(policy)  # before the optimiser: FSDP2 turns parameters into shards
        self.optimizer = torch.optim.AdamW(policy.parameters(), lr=o.lr, weight_decay=o.weight_decay)
        warm = max(1, round(o.warmup_ratio * o.steps))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if o.warmup_ratio > 0 else 1.0)
        self.engine = engine or HFEngine(policy.model, tokenizer, prefix_reuse=cfg.tree.prefix_reuse)
        # fixed ids whose log-probs check, after each sync, that a separate engine serves the current policy
        self.probe = prompt_ids(tokenizer, self.questions[0].question) if self.questions else None
        self.step_done = 0
        self.reporters: list[Callable[[dict], None]] = []
        """Called with each step's metrics row after it is written (rank 0; e.g. tg.store.reporters.tensorboard)."""
        self.advantage_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        """Replaces the leaves' advantage (Eq. 7) when set: (rewards [G] float64, tree ids [G] numbered within each
        prompt, prompt ids [G]) -> [G], e.g. notebook 05 trains with the student's `my_tree_advantages`. The
        logged adv_* statistics stay tg's (tg.batch.leaf_advantages)."""
        self.loss_fn: Callable[..., torch.Tensor] | None = None
        """Replaces the loss (Eq. 8) when set: (logp, old_logp, ref_logp [B, T], advantages [B], mask [B, T], *,
        clip, beta) -> scalar, e.g. the student's `my_grpo_loss`; its value and gradient train, the logged loss
        statistics stay tg's. Needs the config's loss to be Eq. 8's (`check_replaceable`)."""
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # a micro-batch's common start runs once (tg.packing.packed_logits), except under gradient checkpointing,
        # whose recomputation in transformers drops a layer's cache, and where the ranks cannot (FSDP2)
        self.share_prefix = not cfg.model.gradient_checkpointing and self.par.shares_prefix

    # ---- data ------------------------------------------------------------------------------------
    def batch_questions(self, step: int) -> list[Question]:
        """Questions of step `step` (0-based): consecutive slices of seeded per-epoch permutations."""
        p, n = self.cfg.optim.prompts_per_step, len(self.questions)
        out = []
        for pos in range(step * p, (step + 1) * p):
            epoch, i = divmod(pos, n)
            order = random.Random(self.cfg.optim.seed * 7919 + epoch).sample(range(n), n)
            out.append(self.questions[order[i]])
        return out

    def my_questions(self, step: int) -> list[Question]:
        """This rank's questions of step `step`: its rollout shards' slices, concatenated (tg.gpu.distributed)."""
        qs, slices = self.batch_questions(step), shard_slices(self.cfg.optim.prompts_per_step, self.par.shards)
        return [q for k in self.par.my_shards() for q in qs[slices[k]]]

    # ---- rollout ---------------------------------------------------------------------------------
    def rollout(self, questions: Sequence[Question], step: int) -> tuple[list[list[Tree]], list[Ledger]]:
        """Trees and ledgers of this rank's `questions`, one `sample_batch` per rollout shard, each from its seed."""
        self.policy.model.eval()
        per = self.cfg.optim.prompts_per_step // self.par.shards
        trees: list[list[Tree]] = []
        leds: list[Ledger] = []
        env = CheckedEnv(self.env, len(self.tokenizer), self.cfg.agent.max_obs_tokens)  # tg.agent.contract
        with self.par.rollout_context(self.policy):
            for i, k in enumerate(self.par.my_shards()):
                part, stats = sample_batch(self.engine, env, questions[i * per:(i + 1) * per],
                                           self.cfg, shard_seed(rollout_seed(self.cfg.optim.seed, step), k))
                for t in (t for ts in part for t in ts):
                    t.question += i * per  # the question's index among this rank's questions
                trees += part
                leds += ledgers(part, stats)
        return trees, leds

    # ---- log-probs and the update ----------------------------------------------------------------
    def micro_batches(self, rows: Rows) -> list[list[Micro]]:
        """This rank's micro-batches per PPO mini-batch (tg.batch.micro_batches)."""
        return micro_batches(rows, self.cfg.optim, self.par.shards, self.share_prefix, self.pad_id)

    def _forward_logprobs(self, model: Any, mb: Micro, prefix_model: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs [B, width] of the micro-batch's policy tokens (0 elsewhere) and the logits [N, V] that
        predict them, one row per policy token in `mb.policy` order. `prefix_model`: the module that runs the
        shared prefix when `model` is a DDP wrapper (tg.packing.packed_logits)."""
        dev = next(model.parameters()).device
        if mb.packed is not None:  # the shared start once; each tree's rows once, along their prefixes (tg.packing)
            logits = packed_logits(model, mb.packed, mb.shared, prefix_model)
        else:  # right-padded rows: under the causal mask no real token sees the padding after it, so no
            # attention mask is passed and attention takes its causal kernel (the same logits, tested)
            logits = model(input_ids=mb.ids.to(dev)).logits.flatten(0, 1)
        picked = logits[mb.at.to(dev)]
        return _at_policy(logprobs_at(picked, mb.ids[mb.policy].to(dev)), mb), picked

    @torch.no_grad()
    def _frozen_logprobs(self, micros: Sequence[Micro], reference: bool) -> list[torch.Tensor]:
        """Log-probs per micro-batch without gradient: of the reference (adapter disabled) or the old policy."""
        model = self.policy.reference_model if reference else self.policy.model
        with self.policy.reference_context() if reference else torch.no_grad():
            return [self._forward_logprobs(model, mb)[0] for mb in micros]

    def _micro_loss(self, rows: Rows, mb: Micro, old: torch.Tensor | None, ref: torch.Tensor | None,
                    weight: float) -> dict:
        o = self.cfg.optim
        logp, picked = self._forward_logprobs(self.train_model, mb, prefix_model=self.policy.model)
        mask = rows.mask[mb.idx, :logp.shape[1]].to(logp.device).float()
        ent = _at_policy(entropy(picked if o.entropy_coef > 0 else picked.detach()), mb)
        adv = rows.adv[mb.idx].to(logp.device)
        adv = adv[:, :logp.shape[1]] if adv.dim() == 2 else adv
        loss, stats = grpo_loss(logp, logp.detach() if old is None else old, adv, mask,
                                ref_logp=ref, entropy=ent, clip_low=o.clip_low, clip_high=o.clip_high,
                                dual_clip=o.dual_clip, agg=o.loss_agg, kl_beta=o.kl_beta, entropy_coef=o.entropy_coef,
                                ratio=o.ratio)
        if self.loss_fn is not None:
            loss = self.loss_fn(logp, logp.detach() if old is None else old, ref, adv, mask, clip=o.clip_low,
                                beta=o.kl_beta).reshape(())
        if not torch.isfinite(loss):
            raise NonFiniteError(f"step {self.step_done + 1}: loss is {loss.item()} (pg_loss {stats['pg_loss']}, "
                                 f"kl {stats['kl']}); no checkpoint written")
        (loss * weight).backward()
        stats["loss"] = float(loss.detach())
        return stats

    def update(self, rows: Rows) -> dict[str, float]:
        """One PPO epoch over the mini-batches; returns the last mini-batch's stats."""
        o = self.cfg.optim
        minis = self.micro_batches(rows)
        flat = [mb for mini in minis for mb in mini]
        t0 = time.perf_counter()
        ref = iter(self._frozen_logprobs(flat, reference=True)) if o.kl_beta > 0 else None
        old = iter(self._frozen_logprobs(flat, reference=False)) if len(minis) > 1 else None
        sizes = rows.mask.sum(1).float() if o.loss_agg == "token-mean" else torch.ones(len(rows.question))
        self.policy.model.train()
        logprob_s = time.perf_counter() - t0
        stats: dict[str, float] = {}
        for mini in minis:
            local = sum(float(sizes[mb.idx].sum()) for mb in mini)
            total = self.par.sum(local)
            stats = {}
            for i, mb in enumerate(mini):
                size = float(sizes[mb.idx].sum())
                with self.par.accumulate(self.train_model, last=i == len(mini) - 1):
                    part = self._micro_loss(rows, mb, next(old) if old else None, next(ref) if ref else None,
                                            self.par.grad_weight(size, total))
                share = size / local if local > 0 else 0.0   # this rank's part of the mini-batch, as in the loss
                for k, v in part.items():
                    stats[k] = stats.get(k, 0.0) + share * float(v)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), o.grad_clip)
            if not torch.isfinite(grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError(f"step {self.step_done + 1}: grad_norm is {grad_norm.item()}; "
                                     "no checkpoint written")
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        stats.update(grad_norm=float(grad_norm), lr=self.scheduler.get_last_lr()[0], logprob_s=logprob_s)
        sync = self.engine.sync(self.policy.model, self.probe)
        if sync is not None:
            stats["sync_maxdiff"] = sync
        return stats

    # ---- one step ----------------------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        """One training step; every rank returns the same metrics row (gathered over the ranks)."""
        o, s = self.cfg.optim, self.step_done
        questions = self.my_questions(s)
        t0 = time.perf_counter()
        try:
            trees, leds = self.rollout(questions, s)
        except FloatingPointError as err:
            raise NonFiniteError(f"step {s + 1}: rollout failed: {err}; no checkpoint written") from err
        flat = [t for ts in trees for t in ts]
        t1 = time.perf_counter()
        sc = leaf_rewards(flat, [q.golden_answers for q in questions], self.reward_fn, [q.question for q in questions])
        adv, row_adv = leaf_advantages(sc, flat, o, self.cfg.tree.is_chain)
        if self.advantage_fn is not None:
            check_replaceable(self.cfg, loss=self.loss_fn is not None)
            row_adv = torch.as_tensor(self.advantage_fn(torch.tensor(sc["reward"], dtype=torch.float64),
                                                        torch.tensor(sc["tree"]), torch.tensor(sc["prompt"])))
        elif self.loss_fn is not None:
            check_replaceable(self.cfg, loss=True)
        stats = self.update(build_rows(flat, row_adv, self.pad_id))
        self.step_done += 1
        stats.update(rollout_s=t1 - t0, update_s=time.perf_counter() - t1 - stats["logprob_s"])
        if self.par.world > 1:
            sc, leds, adv, stats = gather_step(self.par, sc, leds, adv, stats)
        led = Ledger.total(leds).per(o.prompts_per_step)
        return step_metrics(self.step_done, sc, led, adv, stats)

    # ---- checkpoints --------------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    def save_checkpoint(self) -> Path | None:
        """Weights (adapter for LoRA), optimiser, scheduler, every RNG, step (tg.store.rundir.write_checkpoint: the
        previous checkpoint stays until the new one reads back). Non-finite weights are never saved.
        Every rank calls it; rank 0 writes the file (with every rank's RNG state) and returns its path."""
        weights = self.par.model_state(self.policy)
        optim = self.par.optim_state(self.policy, self.optimizer)
        rngs = self.par.rng_states()
        if not self.par.is_main:
            return None
        bad = [k for k, v in weights.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
        if bad:
            raise NonFiniteError(f"step {self.step_done}: {len(bad)} of {len(weights)} weight tensors are not finite "
                                 f"(first: {bad[0]}); no checkpoint written, {self.checkpoint_path} is kept")
        state = {"weights": weights, "optimizer": optim, "scheduler": self.scheduler.state_dict(),
                 "step": self.step_done, "rng": rngs[0], "config": self.cfg.to_dict()}
        if self.par.world > 1:
            state["rng_ranks"] = rngs
        return write_checkpoint(self.run_dir, state)

    def load_checkpoint(self) -> int:
        """Restore the newest readable checkpoint (checkpoint.pt, else checkpoint.prev.pt, with a warning); refused
        (RunDirError) when it was trained under a config that trains differently (tg.store.rundir.check_trained_as)."""
        check_trained_as(self.run_dir, self.cfg, "resume under the trained values, or train in a new run directory")
        loaded = read_checkpoint(self.run_dir)
        if loaded.skipped:
            logger.warning("%s; resuming from the previous checkpoint %s (step %d)", loaded.skipped, loaded.path,
                           loaded.state["step"])
        state = loaded.state
        self.par.load_model_state(self.policy, state["weights"])
        self.par.load_optim_state(self.policy, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        ranks = state.get("rng_ranks", [state["rng"]])
        # the same world size restores each rank's own RNG; another one (same rollout_shards) restarts them
        # from rank 0's: rollouts draw from their own seeded generators, so the samples are the same
        set_rng_state(ranks[self.par.rank] if len(ranks) == self.par.world else state["rng"])
        self.step_done = state["step"]
        return self.step_done

    # ---- the loop -------------------------------------------------------------------------------------
    def fit(self, steps: int | None = None, resume: bool = False, progress: bool = True) -> list[dict]:
        """Train to `steps` (default optim.steps); append metrics to metrics.jsonl; checkpoint every K steps.
        Holds the run directory's lock (tg.store.rundir.run_lock) throughout: one run per directory at a time.
        Over several ranks every rank calls it; rank 0 alone locks and writes (tg.gpu.distributed, 6)."""
        with run_lock(self.run_dir) if self.par.is_main else contextlib.nullcontext():
            with failures_as_rank_lost(self.par.world):
                return self._fit(steps or self.cfg.optim.steps, resume, progress)

    def _fit(self, total: int, resume: bool, progress: bool) -> list[dict]:
        metrics_path = self.run_dir / "metrics.jsonl"
        if resume and has_checkpoint(self.run_dir):
            self.load_checkpoint()
        elif not resume:
            _set_seed(self.cfg.optim.seed)
        kept = [json.loads(x) for x in metrics_path.read_text().splitlines()] if metrics_path.exists() and resume else []
        kept = [r for r in kept if r["step"] <= self.step_done]
        self.engine.sync(self.policy.model, self.probe)  # a separate engine serves the (resumed) policy from step one
        main = self.par.is_main
        if main:
            atomic_write_text(metrics_path, "".join(json.dumps(r) + "\n" for r in kept))
        every = self.cfg.optim.checkpoint_every
        bar = tqdm(total=total, initial=self.step_done, desc="train", disable=not (progress and main))
        while self.step_done < total:
            row = self.step()
            kept.append(row)
            if main:
                with metrics_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                for report in self.reporters:
                    report(row)
            if (every and self.step_done % every == 0) or self.step_done == total:
                self.save_checkpoint()
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward']:.3f}", em=f"{row['em']:.3f}")
        bar.close()
        return kept
