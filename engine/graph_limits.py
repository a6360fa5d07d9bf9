"""MLX's CUDA graph batching for a paged engine, set before MLX starts its stream.

MLX's CUDA backend ends a graph (and launches it) every MLX_MAX_OPS_PER_BUFFER
kernels or MLX_MAX_MB_PER_BUFFER MB of the kernels' input arrays (100 and
1000 on an H100/H200), counting each input's whole size. A layer's KV pool is
an input of every attention launch, so with a server-sized pool (a GB or more
a layer) every such launch ends a graph, and with ten graphs in flight MLX's
eval waits for one to finish: on an H200 at 32 x 8K shared on an 8,000-page
pool, encoding a cascade step took the host 7-8 ms, against 4.7-5.4 ms with
the byte bound lifted. The large inputs here persist (weights, the pool: a
graph's end frees none of them), so the engine lifts the byte bound unless it
is set; the op bound stays.
"""

from __future__ import annotations

import os

MB_PER_BUFFER_ENV = "MLX_MAX_MB_PER_BUFFER"
LIFTED_MB = 1 << 20     # a TB of inputs: never reached


def lift_graph_byte_limit() -> None:
    """Lift MLX's graph byte bound unless set; effective before MLX's first GPU op in this process."""
    os.environ.setdefault(MB_PER_BUFFER_ENV, str(LIFTED_MB))
