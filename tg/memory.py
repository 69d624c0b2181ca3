"""Keep freed memory in the process: a CPU training step makes and frees tensors of tens of MB (a micro-batch's
activations, logits, attention mask and their gradients). glibc's allocator serves blocks that large by mapping
fresh pages from the kernel and unmaps them on free, so every step pays page faults to fault them in and zero
them again (what that costs an update: bench/allocator.py). Told to serve them from
its heap and to keep the freed ones, it reuses them. Only the allocator's bookkeeping changes, no number: the
same kernels run on the same values (tests/test_rerun.py reruns committed rows to the last bit with it on).
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc's mallopt parameters (malloc.h)."""
MMAP_THRESHOLD_MAX = 32 << 20
"""Blocks up to this size come from the heap (glibc's ceiling for the threshold on 64-bit machines)."""


def keep_freed_memory() -> bool:
    """Serve blocks up to `MMAP_THRESHOLD_MAX` from the heap and never give the heap's top back to the kernel.
    Process-wide and idempotent; True where it took effect (Linux with glibc), False elsewhere (nothing done)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # another C library (musl): its allocator, untouched
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
