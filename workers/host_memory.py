"""Keep freed host memory in the process instead of handing it back to the kernel.

glibc serves every allocation above 32 MiB with a fresh mmap and unmaps it on free, so
each training step page-faults its large CPU tensors (logits, the tied embedding's dense
gradient, FSDP's gather buffers) in again, and the kernel zeroes every page. On CPU this
cost 3-4 s of a 20 s actor update of the 135M model (measured with the profiler:
`fill_`, `copy_`, `add` and the embedding backward shrink). Turning mmap off for malloc
and never trimming the heap keeps those pages mapped, as a GPU caching allocator keeps
device memory; the resident size stays at the step's peak.

Applied once per worker process on Linux with glibc; set HYBRID_KEEP_HOST_MEMORY=0 to
leave malloc as it is.

`process_stats` reads this process's resident memory, open file descriptors and threads
(the `perf/cpu_memory_rss_gb` metrics and the soak run, scripts/soak.py, read it).
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import threading

# mallopt parameters from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4

_applied: bool | None = None


def keep_freed_host_memory() -> bool:
    """Tune glibc malloc as described above; returns whether it is in effect."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("HYBRID_KEEP_HOST_MEMORY", "1") == "0":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    settings = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, 256 * 2**20))
    # mallopt returns 1 on success; a refusal is reported, not hidden
    failed = [param for param, value in settings if libc.mallopt(param, value) != 1]
    if failed:
        raise RuntimeError(
            f"glibc mallopt refused parameters {failed}; set HYBRID_KEEP_HOST_MEMORY=0 to skip this tuning"
        )
    _applied = True
    return True


def _rss_bytes() -> int:
    """Resident set size now; where /proc is missing, the peak (getrusage) instead."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if platform.system() == "Darwin" else peak * 1024  # macOS: bytes, Linux: KiB


def _thread_count() -> int:
    """OS threads of this process (torch's, gloo's and Ray's included), not only Python's."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return threading.active_count()


def _fd_count() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1  # unknown on this system


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _malloc_in_use() -> int | None:
    """Bytes malloc has handed out and not got back (glibc >= 2.33's mallinfo2: heap blocks
    in use plus mmapped blocks); None elsewhere. Resident memory above this is memory the
    allocator keeps: freed blocks, and holes between live ones."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL("libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def process_stats() -> dict[str, float]:
    """{'pid', 'rss_gb', 'fds', 'threads'} of this process, and with glibc 'malloc_in_use_gb'
    (see `_malloc_in_use`); well under a millisecond on Linux."""
    stats = {"pid": os.getpid(), "rss_gb": _rss_bytes() / 1e9, "fds": _fd_count(), "threads": _thread_count()}
    in_use = _malloc_in_use()
    if in_use is not None:
        stats["malloc_in_use_gb"] = in_use / 1e9
    return stats
