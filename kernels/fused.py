"""Host side of the fused paged-attention kernels, shared by CUDA and Metal.

A platform module (``cuda``, ``metal``) supplies only its kernel sources and
its kernel factory; this module plans the tiles, picks template constants,
sizes the grid and launches, identically for both:

- the partial kernel: one block per (page tile, head group, KV head) reads its
  pages in place, stages each chunk of K and V tokens in shared memory once
  and runs every query head of the KV head against it on the matrix units
  (16-bit operands, float32 accumulation), writing a normalized state and a
  log2 LSE per (tile, head);
- the merge kernel: one warp per (group, head) folds contiguous states by
  log-sum-exp; it merges a row's tiles and serves ``merge_states``.

Pools the kernels do not take (float32, or a head dim that is not a multiple
of 32 up to 128) go through the portable kernels, on the same device.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx
import numpy as np

from . import portable
from .csr import PagedCsrView
from .tile_plan import HEADS_PER_WARP, HeadLayout, fused_tiles, head_layout

LOG2E = 1.0 / math.log(2.0)

# Tensor-core operands are 16-bit; a float32 pool would need a different
# (tf32) fragment layout for a configuration nobody serves from.
KERNEL_DTYPES = (mx.bfloat16, mx.float16)
MAX_HEAD_DIM = 128        # accumulators (D/2 floats) + Q fragments (D/4 words) per lane stay in registers
MERGE_THREADS = 128
POISON_ENV = "MLXCEL_POISON_OUTPUTS"

PARTIAL_INPUTS = ["q", "k_pool", "v_pool", "indices", "last_page_len", "tiles"]
PARTIAL_OUTPUTS = ["out", "out_lse"]
MERGE_INPUTS = ["v_in", "lse_in", "indptr"]
MERGE_OUTPUTS = ["out", "out_lse"]

# (name, input names, output names, source, header, dynamic shared bytes) -> kernel
KernelFactory = Callable[[str, list, list, str, str, int], Callable]


@dataclass(frozen=True)
class Platform:
    name: str
    header: str
    partial_source: str
    merge_source: str
    make_kernel: KernelFactory
    warps: int            # warps (simdgroups) of 32 lanes per partial block
    chunk_tokens: int     # KV tokens staged per iteration
    stages: int           # staging buffers (2: the next chunk loads while this one is used)

    def staging_bytes(self, head_dim: int) -> int:
        """Shared memory of one partial block: the K and V chunks of every
        stage (rows padded by 8 elements so matrix loads hit distinct banks),
        reused after the loop for the warps' states (float32 accumulators,
        max, sum)."""
        stages = self.stages * 2 * self.chunk_tokens * (head_dim + 8) * 2
        states = self.warps * HEADS_PER_WARP * (head_dim + 2) * 4
        return max(stages, states)


def scale_bits(scale: float) -> int:
    """The float32 bits of scale * log2(e), as a template int: the kernel
    works in the log2 domain (exp2) and a model has one scale, so baking it in
    costs one compile per model, not an argument upload per call."""
    return struct.unpack("<i", struct.pack("<f", float(scale) * LOG2E))[0]


def unsupported(q: mx.array, k_pool: mx.array) -> str | None:
    """Why the fused kernel does not take these inputs, or None."""
    d = q.shape[-1]
    if k_pool.dtype not in KERNEL_DTYPES:
        return f"pool dtype {k_pool.dtype} (fused kernels take bfloat16/float16)"
    if d % 32 or d > MAX_HEAD_DIM:
        return f"head dim {d} (fused kernels take multiples of 32 up to {MAX_HEAD_DIM})"
    return None


def poison_from_env() -> float | None:
    text = os.environ.get(POISON_ENV, "").strip()
    return float(text) if text else None


@dataclass
class FusedKernels:
    """The two fused kernels of one platform, compiled on first use per head dim."""

    platform: Platform
    # A value (NaN) every output is filled with before the kernel runs, so
    # tests prove each element is written. Off in serving: the fill is an
    # extra launch per output. MLXCEL_POISON_OUTPUTS=nan sets it for a whole run.
    poison: float | None = field(default_factory=poison_from_env)
    _kernels: dict = field(default_factory=dict)

    def _kernel(self, kind: str, head_dim: int) -> Callable:
        key = (kind, head_dim)
        kernel = self._kernels.get(key)
        if kernel is None:
            p = self.platform
            source, inputs, outputs = ((p.partial_source, PARTIAL_INPUTS, PARTIAL_OUTPUTS) if kind == "partial"
                                       else (p.merge_source, MERGE_INPUTS, MERGE_OUTPUTS))
            # The digest names the source: MLX caches compiled kernels by name
            # (on disk too), so an edited source must never reuse an old binary.
            digest = hashlib.sha1((p.header + source).encode()).hexdigest()[:12]
            shared = p.staging_bytes(head_dim) if kind == "partial" else 0
            kernel = p.make_kernel(f"mlxcel_{kind}_{digest}", inputs, outputs, source, p.header, shared)
            self._kernels[key] = kernel
        return kernel

    def partial_tiles(self, q: mx.array, k_pool: mx.array, v_pool: mx.array, csr: PagedCsrView,
                      geometry: mx.array, layout: HeadLayout, scale: float) -> tuple[mx.array, mx.array]:
        """One launch: the states of every tile, o [S, Hq, D] float32, lse [S, Hq] log2."""
        tiles, (_, hq, d), hkv = geometry.shape[0], q.shape, k_pool.shape[2]
        p = self.platform
        return self._kernel("partial", d)(
            inputs=[q, k_pool, v_pool, csr.indices, csr.last_page_len, geometry],
            template=[("T", k_pool.dtype), ("TQ", q.dtype), ("D", d), ("WM", layout.warps_m),
                      ("WARPS", p.warps), ("CHUNK", p.chunk_tokens), ("SCALE_BITS", scale_bits(scale))],
            grid=(tiles * layout.groups * p.warps * 32, hkv, 1),
            threadgroup=(p.warps * 32, 1, 1),
            output_shapes=[(tiles, hq, d), (tiles, hq)],
            output_dtypes=[mx.float32, mx.float32],
            init_value=self.poison,
        )

    def merge_groups(self, v_in: mx.array, lse_in: mx.array, indptr: mx.array) -> tuple[mx.array, mx.array]:
        """One launch: v [M, H, D], lse [M, H] from contiguous groups of states."""
        groups, (_, heads, d) = indptr.shape[0] - 1, v_in.shape
        lanes = groups * heads * 32
        return self._kernel("merge", d)(
            inputs=[v_in, lse_in, indptr],
            template=[("TV", v_in.dtype), ("TL", lse_in.dtype), ("D", d)],
            grid=(-(-lanes // MERGE_THREADS) * MERGE_THREADS, 1, 1),
            threadgroup=(MERGE_THREADS, 1, 1),
            output_shapes=[(groups, heads, d), (groups, heads)],
            output_dtypes=[mx.float32, mx.float32],
            init_value=self.poison,
        )

    def paged_attention_partial(self, q: mx.array, k_pool: mx.array, v_pool: mx.array, csr: PagedCsrView,
                                *, scale: float, chunk_pages: int | None = None) -> tuple[mx.array, mx.array]:
        rows, hq, d = q.shape
        if rows != csr.num_rows:
            raise ValueError(f"q has {rows} rows but the page table has {csr.num_rows}")
        if hq % k_pool.shape[2]:
            raise ValueError(f"{hq} query heads are not a multiple of {k_pool.shape[2]} KV heads")
        if unsupported(q, k_pool):
            return portable.paged_attention_partial(q, k_pool, v_pool, csr, scale=scale, chunk_pages=chunk_pages)
        layout = head_layout(hq // k_pool.shape[2], self.platform.warps)
        plan = fused_tiles(csr, chunk_pages, k_pool.shape[2] * layout.groups)
        if plan.num_tiles == 0:
            return mx.zeros((rows, hq, d), mx.float32), mx.full((rows, hq), -mx.inf, mx.float32)
        o, lse = self.partial_tiles(q, k_pool, v_pool, csr, plan.geometry, layout, scale)
        if plan.one_per_row:
            return o, lse
        return self.merge_groups(o, lse, plan.row_indptr_device)

    def merge_states(self, v_in: mx.array, lse_in: mx.array, o_indptr) -> tuple[mx.array, mx.array]:
        d = v_in.shape[-1]
        if d % 32 or v_in.shape[0] == 0:
            return portable.merge_states(v_in, lse_in, o_indptr)
        if isinstance(o_indptr, mx.array):
            return self.merge_groups(v_in, lse_in, o_indptr.astype(mx.int32))
        indptr = np.asarray(o_indptr, dtype=np.int64)
        if (np.diff(indptr) == 1).all():     # every group one state: a copy, no arithmetic
            order = mx.array(indptr[:-1].astype(np.int32))
            return v_in[order].astype(mx.float32), lse_in[order].astype(mx.float32)
        return self.merge_groups(v_in, lse_in, mx.array(indptr.astype(np.int32)))
