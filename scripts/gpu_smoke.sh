#!/usr/bin/env bash
# GPU smoke test: one CUDA GPU, no network, under 5 minutes (the warm-up cache .cache/tg copied from a
# CPU machine saves its first-run warm-up). From the repository root:
#
#     scripts/gpu_smoke.sh [WHEEL_DIR]        # WHEEL_DIR: local wheels, used when bitsandbytes is missing
#
# 1. `tg doctor` (versions against the tested matrix) and `tg preflight` of the paper preset (reports
#    what this machine lacks for the real run; never stops the smoke test);
# 2. the CPU preset's tiny policy on CUDA, QLoRA 4-bit NF4 with bf16 compute: the longest sample first,
#    3 Tree-GRPO steps (2,2,1) with the HF engine, a greedy evaluation of 8 + 8 questions; prints step
#    times and peak GPU memory; then the same with the vLLM engine if `import vllm` works;
# 3. if TG_MODEL_DIR names a local Qwen2.5-1.5B (and data/multi-hop plus a retriever are there): the
#    paper preset's pre-flight with measurement and 2 steps of 4 prompts, evaluation on 4 questions.
# Environment: PYTHON (default .venv/bin/python, else python3), TG_MODEL_DIR (optional).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
WHEELS=${1:-}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset TG_PRESET

if ! "$PY" -c "import bitsandbytes" 2>/dev/null; then
  [ -n "$WHEELS" ] || { echo "bitsandbytes is not importable: pass a directory of wheels: $0 WHEEL_DIR"; exit 2; }
  "$PY" -m pip install --no-index --find-links "$WHEELS" bitsandbytes
fi
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch'"

echo "== doctor"; "$PY" -m tg.cli doctor || true
echo "== preflight, paper preset (quick schedule; static checks)"
"$PY" -m tg.cli preflight --preset paper-1.5b-multi-hop --schedule quick --no-measure || true

smoke() {  # $1: preset, $2: engine (hf | vllm), then overrides; nothing is appended to results/
  "$PY" - "$@" <<'EOF'
import sys, time, torch
from tg.commands import build_run, evaluate_model
from tg.config import load_config
from tg.preflight import check_longest_sample, format_report
preset, engine, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
cfg = load_config(preset, "model.finetune=qlora", "model.dtype=bfloat16", f"agent.engine={engine}",
                  "agent.vllm_gpu_memory_utilization=0.3", "optim.steps=3", "optim.prompts_per_step=8",
                  "optim.mini_batch_prompts=8", "optim.micro_batch_rows=16", "eval.n_single=8", "eval.n_multi=8",
                  "eval.batch_size=16", *extra)
print(cfg, flush=True)
t0 = time.perf_counter()
run = build_run(cfg, f"runs/gpu-smoke-{engine}-{cfg.hash()}")
print(f"loaded in {time.perf_counter() - t0:.0f} s (warm-up included when not cached)")
longest, _ = check_longest_sample(run.trainer.policy.model, cfg, run.trainer.policy.model.config.vocab_size)
print(format_report([longest]))
torch.cuda.reset_peak_memory_stats()
for row in run.trainer.fit(progress=False):
    print(f"step {row['step']}: rollout {row['rollout_s']:.1f} s, update {row['update_s']:.1f} s, "
          f"reward {row['reward']:.3f}, trajectories/question {row['trajectories']:.0f}"
          + (f", vLLM sync max |d logprob| {row['sync_maxdiff']:.3g}" if "sync_maxdiff" in row else ""))
result = evaluate_model(run.trainer.policy.model, run.tokenizer, run.resources, cfg, progress=False)
print("greedy EM:", {k: round(v, 3) for k, v in result.by_source().items()})
print(f"peak GPU memory ({engine}): {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB allocated, "
      f"{torch.cuda.max_memory_reserved() / 2**30:.2f} GiB reserved")
EOF
}

echo "== tiny policy, QLoRA + bf16, HF engine"; smoke cpu hf
if "$PY" -c "import vllm" 2>/dev/null; then echo "== tiny policy, vLLM engine"; smoke cpu vllm
else echo "== vLLM not importable: skipped"; fi

if [ -n "${TG_MODEL_DIR:-}" ]; then
  echo "== paper preset on $TG_MODEL_DIR: pre-flight with measurement, 2 steps of 4 prompts"
  if "$PY" -m tg.cli preflight --preset paper-1.5b-multi-hop --schedule quick --set "model.name_or_path=$TG_MODEL_DIR"
  then smoke paper-1.5b-multi-hop hf "model.name_or_path=$TG_MODEL_DIR" optim.steps=2 optim.prompts_per_step=4 \
             optim.mini_batch_prompts=4 optim.micro_batch_rows=2 model.gradient_checkpointing=true eval.n_multi=4 \
             eval.batch_size=4
  else echo "== the paper preset is not ready here (the failing checks above say why): its steps are skipped"; fi
else
  echo "== TG_MODEL_DIR not set: the paper-preset steps are skipped (no network to fetch Qwen2.5-1.5B)"
fi
echo "== gpu smoke test done"
