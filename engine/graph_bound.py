"""MLX's CUDA graph byte bound, widened by what the engine's pool adds to it.

MLX's CUDA backend ends a graph after ``MLX_MAX_OPS_PER_BUFFER`` kernels (100
on Hopper) or once its kernels' inputs add up to ``MLX_MAX_MB_PER_BUFFER`` MB
(1000 on Hopper), counting each input's whole array: a layer's whole K and V
pool at each of its attention launches (three a cascade layer: the K/V store,
level 0 and the private level). A pool sized to a server's memory then ends a
graph at every attention launch, and each graph costs the host an update and a
launch: on an H100, 32 sessions behind an 8K prefix with a 23.6 GB pool, a
cascade step took 9.71 / 8.37 ms at MLX's bound and 7.26 / 7.24 with none (the
bench's own 0.26 GB pool: 7.41 / 7.45 at MLX's bound). With no bound a graph
also holds every temporary of its 100 kernels until it ends: in that cell a
read's peak memory rose from 37 to 57-63 GB. So the bound grows by two
cascade layers' counts of the pool only, and a graph still spans about as many
layers as it does with a small pool.

MLX reads the variable once, when it first uses the GPU, so a command sets it
before it loads a model; a value already in the environment stays.
"""

from __future__ import annotations

import math
import os

import mlx.core as mx

from .pool import PoolGeometry

BYTE_BOUND_ENV = "MLX_MAX_MB_PER_BUFFER"
MLX_HOPPER_MB = 1000             # MLX's bound on Hopper (its get_graph_limits)
POOL_COUNTS = 2 * 3              # two cascade layers' attention launches, each counting the layer's pool


def bound_mb(layer_pool_bytes: int) -> int:
    """The byte bound (MB) for a pool whose K and V take ``layer_pool_bytes`` a layer."""
    return MLX_HOPPER_MB + POOL_COUNTS * math.ceil(layer_pool_bytes / 2**20)


def widen_for_pool(geometry: PoolGeometry, blocks: int) -> None:
    """Set MLX's byte bound for a pool of ``blocks`` of ``geometry``, on a CUDA
    device, unless the environment names one."""
    if mx.cuda.is_available():
        layer_bytes = blocks * geometry.bytes_per_block // geometry.num_layers
        os.environ.setdefault(BYTE_BOUND_ENV, str(bound_mb(layer_bytes)))
