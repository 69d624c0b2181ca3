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
#    paper preset's pre-flight with measurement and 2 steps of 4 prompts, evaluation on 4 questions;
#    else a random-init model of Qwen2.5-1.5B's shape (built from its config; no weights need fetching):
#    the paper preset's longest micro-batch under QLoRA at 2 and 8 rows, measured peak memory beside the
#    pre-flight's estimate (tg.gpu.estimate), and the whole run's wall time from the measured tokens/s.
# A failing section does not stop the later ones; the script exits 1 if any failed, naming them.
# Environment: PYTHON (default .venv/bin/python, else python3), TG_MODEL_DIR (optional).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
WHEELS=${1:-}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset TG_PRESET

if ! "$PY" -c "import bitsandbytes" 2>/dev/null; then
  [ -n "$WHEELS" ] || { echo "bitsandbytes is not importable: pass a directory of wheels: $0 WHEEL_DIR"; exit 2; }
  "$PY" -m pip install --no-index --find-links "$WHEELS" bitsandbytes || exit 2
fi
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch'" || exit 2
failed=()
section() {  # $1: title, then the command; a failure is recorded, not fatal
  local title=$1; shift; echo "== $title"; local t0=$SECONDS
  "$@" || { echo "!! FAILED: $title"; failed+=("$title"); }
  echo "   ($title: $((SECONDS - t0)) s)"
}

echo "== doctor"; "$PY" -m tg.cli doctor
echo "== preflight, paper preset (quick schedule; static checks: the data and retriever are expected missing)"
"$PY" -m tg.cli preflight --preset paper-1.5b-multi-hop --schedule quick --no-measure

smoke() {  # $1: preset, $2: engine (hf | vllm), then overrides; nothing is appended to results/
  "$PY" - "$@" <<'EOF'
import sys, time, torch
from tg.config import load_config
from tg.gpu.preflight import check_longest_sample, format_report
from tg.pipeline import build_run, evaluate_model
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

shape_check() {  # a random-init Qwen2.5-1.5B-shaped model: memory estimate vs measured, wall time
  "$PY" - <<'EOF'
import tempfile, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from tg.agent.finetune import default_device, trainable_policy
from tg.config import load_config
from tg.gpu.estimate import GIB, QWEN2_5_1_5B as s, longest_row_tokens, memory_estimate
from tg.gpu.preflight import check_longest_sample, check_wall_time, format_report
cfg = load_config("paper-1.5b-multi-hop", schedule="quick")
print(cfg, flush=True)
with tempfile.TemporaryDirectory() as d:
    qwen = Qwen2Config(hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
                       num_key_value_heads=s.kv_heads, intermediate_size=s.intermediate, vocab_size=s.vocab,
                       tie_word_embeddings=s.tied_embeddings, max_position_embeddings=32768)
    with torch.device("cuda"):
        Qwen2ForCausalLM(qwen).to(torch.bfloat16).save_pretrained(d)
    torch.cuda.empty_cache()
    model = trainable_policy(d, cfg.model, default_device()).model
tokens = longest_row_tokens(cfg)
for rows in (cfg.optim.micro_batch_rows, 8):
    c = cfg.with_overrides(f"optim.micro_batch_rows={rows}")
    check, tp = check_longest_sample(model, c, s.vocab)
    est = memory_estimate(s, c, torch.cuda.get_device_properties(0).total_memory)
    # measured: weights, LoRA weights + grads, activations (no optimiser states yet, no CUDA context)
    comparable = est.weights + est.trainable // 2 + est.activations
    print(format_report([check]))
    print(f"rows={rows} x {tokens} tokens: measured peak {tp.peak_gib:.2f} GiB allocated; estimate: weights "
          f"{est.weights / GIB:.2f} + LoRA weights and grads {est.trainable / 2 / GIB:.2f} + activations "
          f"{est.activations / GIB:.2f} = {comparable / GIB:.2f} GiB (ratio measured/estimate "
          f"{tp.peak_gib * GIB / comparable:.2f}); trained {tp.train_tps:,.0f} tokens/s, HF greedy decode "
          f"{tp.decode_tps:,.0f} tokens/s", flush=True)
    if rows == cfg.optim.micro_batch_rows:
        for schedule in ("quick", "paper"):
            print(schedule, format_report([check_wall_time(load_config(cfg.preset, schedule=schedule), tp)]))
EOF
}

section "tiny policy, QLoRA + bf16, HF engine" smoke cpu hf
if "$PY" -c "import vllm" 2>/dev/null; then section "tiny policy, vLLM engine" smoke cpu vllm
else echo "== vLLM not importable: skipped"; fi

if [ -n "${TG_MODEL_DIR:-}" ]; then
  echo "== paper preset on $TG_MODEL_DIR: pre-flight with measurement, 2 steps of 4 prompts"
  if "$PY" -m tg.cli preflight --preset paper-1.5b-multi-hop --schedule quick --set "model.name_or_path=$TG_MODEL_DIR"
  then section "paper preset, 2 steps" smoke paper-1.5b-multi-hop hf "model.name_or_path=$TG_MODEL_DIR" optim.steps=2 \
             optim.prompts_per_step=4 optim.mini_batch_prompts=4 optim.micro_batch_rows=2 \
             model.gradient_checkpointing=true eval.n_multi=4 eval.batch_size=4
  else echo "== the paper preset is not ready here (the failing checks above say why): its steps are skipped"; fi
else
  section "TG_MODEL_DIR not set: a random-init model of Qwen2.5-1.5B's shape, QLoRA" shape_check
fi
[ ${#failed[@]} -eq 0 ] || { printf '== FAILED sections:\n'; printf '   %s\n' "${failed[@]}"; exit 1; }
echo "== gpu smoke test done"
