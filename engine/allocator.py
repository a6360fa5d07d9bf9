"""Keep glibc from returning MLX's large CPU buffers to the kernel after each use.

MLX's CPU backend allocates every intermediate with malloc. Buffers above
glibc's mmap threshold (128 KiB by default, adapting upwards) are fresh mmaps,
so each decode step page-faults its gathered K/V in anew: measured here, a
75 MB page gather took ~73 ms with the defaults and ~44 ms with the heap kept.
The cost: freed memory stays in the process (RSS holds its peak).
MLXCEL_MALLOC_TUNING=0 leaves the defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
HEAP_LIMIT = 1 << 30  # buffers up to 1 GiB come from the heap and are reused


def keep_heap() -> bool:
    """Raise glibc's mmap and trim thresholds; False where that does not apply."""
    if not sys.platform.startswith("linux") or os.environ.get("MLXCEL_MALLOC_TUNING", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt"):  # not glibc (musl has no mallopt)
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, HEAP_LIMIT)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2 * HEAP_LIMIT))
