"""Process start-up settings the engine wants from MLX, applied before MLX
first touches the GPU (its CUDA backend reads them once).

MLX's CUDA backend records kernels into CUDA graphs and launches a graph every
100 kernels or once the graph's inputs pass 1000 MB; each launched graph is a
task, and ``mx.async_eval`` waits while more than 10 tasks are in flight. A
decode step reads every weight and every layer's KV pool: with 14 GB of
weights that is a graph every layer or two, ~30 graphs a step, so the host
could never enqueue a step while the previous one ran (measured on an H200:
the step's wall time was its host time plus its device time). Counting
kernels only, a step is a few graphs and the host runs a step ahead. A user's
own MLX_MAX_OPS_PER_BUFFER / MLX_MAX_MB_PER_BUFFER win.
"""

from __future__ import annotations

import os

GRAPH_SETTINGS = {
    "MLX_MAX_OPS_PER_BUFFER": "200",     # kernels per CUDA graph
    "MLX_MAX_MB_PER_BUFFER": "1000000",  # no input-size bound
}


def tune_mlx() -> None:
    """Set MLX's graph sizes for serving unless the environment already does."""
    for name, value in GRAPH_SETTINGS.items():
        os.environ.setdefault(name, value)
