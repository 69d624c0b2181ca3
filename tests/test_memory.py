"""tg.memory.keep_freed_memory: a tensor of tens of MB comes from the heap instead of fresh kernel pages, and
its memory stays in the process for the next one. Measured with glibc's own counter of mapped bytes (mallinfo2),
in a fresh process: the setting is process-wide and cannot be undone. That it changes no number is
tests/test_rerun.py's job (committed rows rerun to the last bit by a Trainer, which calls it)."""

import json
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import ctypes, json, torch
    from tg.memory import keep_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2

    def mapped_by_a_tensor() -> int:
        before = libc.mallinfo2().hblkhd  # bytes in blocks mapped from the kernel one by one
        x = torch.ones(4 << 20)  # 16 MiB
        return libc.mallinfo2().hblkhd - before

    default = mapped_by_a_tensor()
    took = keep_freed_memory()
    print(json.dumps({"default": default, "took": took, "kept": mapped_by_a_tensor(),
                      "again": keep_freed_memory()}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator: Linux only")
def test_large_tensors_come_from_the_heap_once_freed_memory_is_kept():
    out = subprocess.run([sys.executable, "-c", CHILD], check=True, capture_output=True, text=True).stdout
    r = json.loads(out.splitlines()[-1])
    assert r["default"] >= 16 << 20  # glibc's default: a 16 MiB block is mapped afresh
    assert r["took"] is True and r["again"] is True  # idempotent
    assert r["kept"] == 0  # now served from the heap
