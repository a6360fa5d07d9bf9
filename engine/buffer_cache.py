"""MLX's buffer cache emptied between steps once it nears the memory limit.

MLX keeps freed buffers for reuse up to its memory limit (0.95 of a CUDA
GPU's memory), and a long prompt's prefill fills it: its chunks' attention
scores and activations. Left so, at 32 sessions behind a 32K prefix on an
H100, the decode steps' graph building waited on the device (37 ms of a 47
ms flat step, 9.9 of a 14.7 ms cascade step) while MLX's cache stayed nearly
empty. MLX's CUDA allocator, as its source reads, explains it: while the
device's memory pool holds more than 0.95 of the GPU, each allocation the
cache cannot serve first frees a twentieth of the GPU's worth of cached
buffers, and a host-made array's buffer (managed memory) is freed by
``cudaFree``, which waits for the whole device. Emptied once the cache and
the live arrays pass HIGH_WATER of the limit, the same steps took 38.4 and
9.4 ms, tokens identical (docs/benchmark_results/quantized-kv-2026-12-01.md).
mlx-lm clears the cache after every prefill chunk; below the high water
nothing is emptied here, so a server that only decodes keeps its buffers.
"""

from __future__ import annotations

import mlx.core as mx

# The share of MLX's memory limit held (live arrays and cache together) past
# which the cache is emptied, and the share the cache itself must hold: a pool
# sized near the limit (a server's whole GPU) leaves a decode step's few cached
# buffers alone, where emptying them every step would allocate them anew.
HIGH_WATER = 0.9
CACHE_SHARE = 0.05


def trim() -> bool:
    """Empty MLX's buffer cache where it holds at least CACHE_SHARE of the
    memory limit and it and the live arrays exceed HIGH_WATER of it; whether
    it did."""
    limit, cache = mx.get_memory_limit(), mx.get_cache_memory()
    if not limit or cache < CACHE_SHARE * limit or mx.get_active_memory() + cache <= HIGH_WATER * limit:
        return False
    mx.clear_cache()
    return True
