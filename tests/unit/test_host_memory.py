"""workers/host_memory.py: after the tuning a large allocation comes from the heap (no new
mmap) and its pages stay mapped after free; HYBRID_KEEP_HOST_MEMORY=0 leaves malloc alone.
Each case runs in a fresh interpreter, since malloc settings are per process."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc malloc tuning"
)

PROBE = r"""
import ctypes, json
from workers.host_memory import keep_freed_host_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                 "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
applied = keep_freed_host_memory()
size = 96 * 2**20
ptr = libc.malloc(size)
while_held = libc.mallinfo2()
libc.free(ptr)
after_free = libc.mallinfo2()
print(json.dumps({"applied": applied, "mmapped_while_held": while_held.hblkhd,
                  "heap_while_held": while_held.arena, "heap_after_free": after_free.arena}))
"""


def _probe(**env):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=root, env={**os.environ, **env}, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_large_blocks_come_from_the_heap_and_stay():
    size = 96 * 2**20
    result = _probe(HYBRID_KEEP_HOST_MEMORY="1")
    assert result["applied"] is True
    assert result["mmapped_while_held"] < size  # not a fresh mmap of its own
    assert result["heap_while_held"] >= size
    assert result["heap_after_free"] >= size  # not trimmed: the pages stay mapped


def test_switch_off_leaves_malloc_alone():
    size = 96 * 2**20
    result = _probe(HYBRID_KEEP_HOST_MEMORY="0")
    assert result["applied"] is False
    assert result["mmapped_while_held"] >= size  # glibc's default: a block this large is mmapped
