"""One GRPO training update: `tg` against TRL's `GRPOTrainer`, same tiny model, same batch, one run.

Both sides train the cpu preset's Qwen2ForCausalLM (hidden 128, 4 layers, 4/2 heads, intermediate
512; a word-level tokenizer of a few hundred tokens built locally) on the same fixed batch:
`prompts` x `generations` single-turn completions, every prompt `prompt_len` tokens and every
completion `completion_len` tokens (random ids, no EOS, so nothing is masked or shortened), LoRA
(tg's preset targets, r, alpha) or full fine-tuning alike, K3 KL with beta 0.001 against the
reference (adapter disabled for LoRA, a frozen copy for full FT), seq-mean loss (TRL
`loss_type="grpo"`), AdamW, constant LR, grad-norm clip 1.0, one optimiser step per update.

What is timed (wall clock, `torch.set_num_threads(--threads)`, fp32):
- tg: `Trainer.update(rows)` on prebuilt `Rows`: reference forward (no grad), forward + loss +
  backward, clip, AdamW step, scheduler step. Building the rows and the advantages is not timed.
- TRL: one optimiser step of `GRPOTrainer.train()`, from `on_step_begin` to `on_step_end`:
  `_prepare_inputs` with generation replaced by TRL's own `rollout_func` hook returning the same
  fixed ids (so: padding, reward function, group advantages, reference forward, metrics), then
  `compute_loss` + backward, clip, AdamW step, scheduler step, zero_grad. Not timed: the
  dataloader fetch and logging between steps.
The two run in one process, interleaved step by step (tg before TRL on even repeats, after on odd
ones); the first repeat is a warm-up and is dropped; the table gives medians and their ratio.

    .venv/bin/python bench/train_step.py [--reps 7] [--finetune lora|full] [--threads 1] [--write bench/README.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is flagged experimental

import torch

from _blocks import write_section

from tg.agent.finetune import trainable_policy
from tg.agent.policy import build_tokenizer, save_policy, tiny_qwen2_config
from tg.batch import Rows
from tg.config import load_config
from tg.trainer import Trainer



def tiny_checkpoint(directory: Path, cfg, n_words: int = 300) -> Path:
    """A random-init cpu-preset Qwen2 and a word-level tokenizer of ~n_words words, saved locally."""
    from transformers import Qwen2ForCausalLM
    tok = build_tokenizer([" ".join(f"w{i}" for i in range(n_words))])
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_qwen2_config(cfg.model, tok))
    return save_policy(model, tok, directory)


def fixed_batch(vocab: int, avoid: set[int], rows: int, prompt_len: int, completion_len: int) -> torch.Tensor:
    """[rows, prompt_len + completion_len] random ids that are neither EOS nor special (no early stop)."""
    g = torch.Generator().manual_seed(1)
    allowed = torch.tensor([i for i in range(vocab) if i not in avoid])
    return allowed[torch.randint(len(allowed), (rows, prompt_len + completion_len), generator=g)]


def tg_side(path: Path, cfg, ids: torch.Tensor, prompt_len: int, run_dir: Path):
    """A minimal `Trainer` (no env, no questions) and the `Rows` of the fixed batch."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(path))
    trainer = Trainer(cfg, trainable_policy(path, cfg.model, torch.device("cpu")), tok, env=None,
                      questions=[], run_dir=run_dir)
    mask = torch.zeros_like(ids)
    mask[:, prompt_len:] = 1                                   # policy tokens = the completion
    adv = torch.randn(ids.shape[0], generator=torch.Generator().manual_seed(2))
    n_gen = ids.shape[0] // cfg.optim.prompts_per_step
    rows = Rows(ids, torch.ones_like(ids), mask, adv, [i // n_gen for i in range(ids.shape[0])],
                list(range(ids.shape[0])))                     # independent rows: each its own tree
    return trainer, rows


def trl_side(path: Path, cfg, ids: torch.Tensor, prompt_len: int, n_gen: int, steps: int, out_dir: Path):
    """A GRPOTrainer whose rollout returns the fixed ids; same optimiser settings as tg's config."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    m, o = cfg.model, cfg.optim
    n_prompts = ids.shape[0] // n_gen

    def rollout(prompts: list, trainer) -> dict:             # same rows, in the sampler's order
        assert len(prompts) == ids.shape[0]
        return {"prompt_ids": ids[:, :prompt_len].tolist(), "completion_ids": ids[:, prompt_len:].tolist(),
                "logprobs": None}

    def random_reward(completions, **kwargs) -> list[float]:
        return torch.rand(len(completions)).tolist()

    args = GRPOConfig(
        output_dir=str(out_dir), per_device_train_batch_size=ids.shape[0], num_generations=n_gen,
        max_completion_length=ids.shape[1] - prompt_len, max_steps=steps, learning_rate=o.lr,
        weight_decay=o.weight_decay, max_grad_norm=o.grad_clip, lr_scheduler_type="constant",
        optim="adamw_torch", beta=o.kl_beta, epsilon=o.clip_low, loss_type="grpo", num_iterations=1,
        steps_per_generation=1, gradient_accumulation_steps=1, gradient_checkpointing=m.gradient_checkpointing,
        bf16=False, use_cpu=True, report_to="none", save_strategy="no", logging_steps=10**6,
        disable_tqdm=True, seed=0, dataloader_num_workers=0)
    peft = None if m.finetune == "full" else LoraConfig(
        r=m.lora_r, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout, target_modules=list(m.lora_targets),
        task_type="CAUSAL_LM")
    data = Dataset.from_dict({"prompt": [f"w{i}" for i in range(n_prompts)]})
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return GRPOTrainer(model=model, reward_funcs=random_reward, args=args, train_dataset=data,
                       processing_class=AutoTokenizer.from_pretrained(str(path)), peft_config=peft,
                       rollout_func=rollout)


def measure(reps: int, finetune: str, prompts: int, n_gen: int, prompt_len: int, completion_len: int) -> dict:
    """Interleaved timings (seconds, warm-up first) of tg `Trainer.update` and TRL optimiser steps."""
    from transformers import TrainerCallback
    cfg = load_config("cpu").replace(
        model=dict(finetune=finetune),
        optim=dict(prompts_per_step=prompts, mini_batch_prompts=prompts, micro_batch_rows=prompts * n_gen,
                   kl_beta=0.001, loss_agg="seq-mean"))
    times: dict[str, list[float]] = {"tg": [], "trl": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_checkpoint(Path(tmp) / "policy", cfg)
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(path))
        ids = fixed_batch(len(tok), set(tok.all_special_ids), prompts * n_gen, prompt_len, completion_len)
        tg_trainer, rows = tg_side(path, cfg, ids, prompt_len, Path(tmp) / "tg_run")
        trl = trl_side(path, cfg, ids, prompt_len, n_gen, reps + 1, Path(tmp) / "trl_run")
        n_trained = [sum(p.numel() for p in ps if p.requires_grad)
                     for ps in (tg_trainer.policy.parameters(), trl.model.parameters())]
        assert n_trained[0] == n_trained[1], f"trainable parameters differ (tg, TRL): {n_trained}"

        def tg_update() -> None:
            t0 = time.perf_counter()
            tg_trainer.update(rows)
            times["tg"].append(time.perf_counter() - t0)

        class Interleave(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                if state.global_step % 2 == 0:
                    tg_update()
                self.t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                times["trl"].append(time.perf_counter() - self.t0)
                if state.global_step % 2 == 0:               # global_step was incremented before this call
                    tg_update()

        trl.add_callback(Interleave())
        trl.train()
    assert len(times["tg"]) == len(times["trl"]) == reps + 1, times
    return times


def render(times: dict[str, list[float]], threads: int, finetune: str, prompts: int, n_gen: int, prompt_len: int,
           completion_len: int) -> str:
    import transformers
    import trl
    tg_s, trl_s = (statistics.median(times[k][1:]) for k in ("tg", "trl"))
    ratios = [a / b for a, b in zip(times["tg"][1:], times["trl"][1:])]
    n = len(times["tg"]) - 1
    lines = [
        f"One update: {prompts} prompts x {n_gen} completions, prompt {prompt_len} + completion {completion_len} "
        f"tokens, {finetune} (tg preset targets), K3 KL beta 0.001 with the reference forward, seq-mean "
        f"loss, AdamW, one optimiser step; cpu-preset tiny Qwen2, fp32, {threads} torch thread(s); medians of {n} interleaved "
        f"repeats after a warm-up (trl {trl.__version__}, transformers {transformers.__version__}, "
        f"torch {torch.__version__}).", "",
        "| side | what is timed | median s | min s | max s |", "|---|---|---|---|---|",
        f"| tg | `Trainer.update(rows)` | {tg_s:.3f} | {min(times['tg'][1:]):.3f} | {max(times['tg'][1:]):.3f} |",
        f"| TRL | `GRPOTrainer` step, generation replaced by fixed ids | {trl_s:.3f} | "
        f"{min(times['trl'][1:]):.3f} | {max(times['trl'][1:]):.3f} |",
        f"| tg / TRL | ratio of medians (median of paired ratios {statistics.median(ratios):.2f}) | "
        f"{tg_s / trl_s:.2f} | {min(ratios):.2f} | {max(ratios):.2f} |",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7, help="timed repeats per side (plus one warm-up)")
    ap.add_argument("--finetune", choices=("lora", "full"), default="lora")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--completion-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads: 1 (default) is steady on a shared 2-core host, 2 swung 0.4-3 s there")
    ap.add_argument("--write", default=None, help="replace the train_step section of this markdown file")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    shape = (a.prompts, a.generations, a.prompt_len, a.completion_len)
    times = measure(a.reps, a.finetune, *shape)
    print("per repeat (s), warm-up first:", {k: [round(t, 3) for t in v] for k, v in times.items()})
    table = render(times, a.threads, a.finetune, *shape)
    print(table)
    if a.write:
        write_section(Path(a.write), "train_step", table)


if __name__ == "__main__":
    main()
