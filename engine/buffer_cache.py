"""MLX's buffer cache held under its memory limit between steps.

MLX keeps freed buffers for reuse, up to its memory limit (on CUDA 0.8 of the
GPU's memory). A long prompt's prefill leaves that much cached: its chunks'
attention scores and activations. From then on every allocation the cache
cannot serve frees cached buffers first, and on CUDA a free (``cudaFree``)
waits for the whole device: the next step's graph building stalls until the
running step ends, so the host no longer works ahead of the GPU. mlx-lm
clears the cache after each prefill chunk; the engine clears it once the
cache and the live arrays near the limit, so a decode-only server never
pays for it and a long prefill pays once.
"""

from __future__ import annotations

import mlx.core as mx

# The share of MLX's memory limit held (live arrays and cache together) past
# which the cache is emptied.
HIGH_WATER = 0.9


def trim() -> bool:
    """Empty MLX's buffer cache where it and the live arrays exceed HIGH_WATER
    of the memory limit; whether it did."""
    limit = mx.get_memory_limit()
    if not limit or mx.get_active_memory() + mx.get_cache_memory() <= HIGH_WATER * limit:
        return False
    mx.clear_cache()
    return True
