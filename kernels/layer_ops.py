"""A decoder layer's small ops, each one launch where a fused kernel exists.

On MLX's CUDA backend every launch costs the host several microseconds of
encoding, and a decode step of an 8B model is host-bound at ~800 launches,
so the ops around the matmuls and the attention are fused:

- ``add_rms_norm``: the residual add and the next RMS norm (two launches in
  mlx-lm's block) in one kernel writing both the sum and its norm;
- ``matmul``: a float projection's product; in host-bound steps
  (``host_bound``) the CUDA ops run it over a decode step's few rows as one
  custom kernel (cuda_matmul says why and when);
- where that kernel runs (``folds``), the ops around a projection ride on
  its launch instead of add_rms_norm's: ``matmul_add`` adds the residual to
  o's and down's products (the stream complete, nothing left to add), and
  ``normed_matmul`` / ``normed_swiglu`` normalize the stream on its way into
  q/k/v and gate/up (the latter writing swiglu(gate, up)): two to three
  launches fewer a layer;
- ``split_heads``: the fused q/k/v projection's output split into heads, q
  and k RMS-normalized per head (Qwen3) and roped at each row's position
  (``HeadSplit``), and k and v stored into the pool's slots (up to eight
  launches: two norms, two ropes, two copies, two pool scatters; a quantized
  pool's store is kv_quant's quantizer and three scatters each for k and v,
  which the kernel does as it stores, quantizing as ``kv_quant.quantize``).

The pool store matters beyond its launches: MLX's scatter writes in place
only when nothing else holds the pool array, and the previous step's kernels
hold it until they finish; once the host runs ahead of the GPU (the pipeline
working as it should), a scatter copies the whole layer pool instead. The
CUDA kernel writes the pool's buffer itself and returns q. MLX orders (and
links in its CUDA graphs) only kernels that share an array, so the store is
used only in steps where every read of the pool comes after q: the fused
attention kernels take q, and a prefill chunk's gathers take indices made
from q (``PageGather.after``; the runner decides; a decode row another
attention serves keeps the scatter). A later step's kernels run after this
step's on the stream.

Elsewhere (the CPU, Metal, a rope the kernel does not spell) both run as
MLX's own ops, which define what the kernels compute; on the CPU the head
split spells them in fewer graph nodes, bit for bit (``cpu_layer_ops``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.activations import swiglu

from . import backend_name
from .kv_quant import Pages

LAYER_OPS_ENV = "MLXCEL_LAYER_OPS"
MATMUL_ENV = "MLXCEL_MATMUL"     # skinny: every step's projections; cublas: none; else host-bound steps (no-tma:
                                 # those without TMA)


@dataclass(frozen=True)
class PoolSlots:
    """Where a step's new K/V rows go: one layer's keys and values (float
    arrays ``[num_blocks, block_size, Hkv, D]`` or ``QuantizedPages`` of that
    logical shape) and each row's (block, offset)."""

    keys: Pages
    values: Pages
    blocks: mx.array    # [T] int32
    offsets: mx.array   # [T] int32


class ComposedOps:
    """The layer ops as MLX's own ops: what the fused kernels must compute."""

    stores_in_place = False     # whether split_heads can write the pool's slots itself

    def add_rms_norm(self, residual: mx.array, delta: mx.array, weight: mx.array,
                     eps: float) -> tuple[mx.array, mx.array]:
        """(residual + delta, rms_norm(residual + delta) * weight) over the last axis."""
        total = residual + delta
        return total, mx.fast.rms_norm(total, weight, eps)

    def step_rope(self, heads: "HeadSplit", positions: mx.array,
                  dtype: mx.Dtype) -> tuple[mx.array, mx.array] | None:
        """Rope tables of a step's positions that split_heads takes as ``rope``, made once a step outside
        any layer's trace (the CPU's); None where split_heads ropes by itself."""
        return None

    def split_heads(self, heads: "HeadSplit", qkv: mx.array, positions: mx.array, slots: PoolSlots | None = None,
                    rope: tuple[mx.array, mx.array] | None = None) -> tuple[mx.array, mx.array | None, mx.array | None]:
        """q [T, Hq, D], k and v [T, Hkv, D]; with ``slots`` the kernels may
        store k and v into the pool themselves and return (q, None, None), else
        the caller stores them. ``rope``: ``step_rope``'s tables."""
        q, k, v = mx.split(qkv.reshape(qkv.shape[0], -1), heads.splits, axis=-1)
        return heads.rotate(q, k, v, positions)

    def matmul(self, x: mx.array, weight: mx.array, transposed: mx.array) -> mx.array:
        """x @ weight.T, a float projection's product (weight [N, K]); ``transposed`` is weight.T as MLX's
        matmul takes it."""
        return x @ transposed

    def folds(self, x: mx.array, weight: mx.array) -> bool:
        """Whether the norm before a projection of x by this weight, or the residual add after it, is best
        done in the projection's launch (``normed_matmul``, ``normed_swiglu``, ``matmul_add``) rather than
        in ``add_rms_norm``'s."""
        return False

    def normed_matmul(self, x: mx.array, norm_weight: mx.array, eps: float, weight: mx.array,
                      transposed: mx.array) -> mx.array:
        """rms_norm(x) * norm_weight @ weight.T."""
        return self.matmul(mx.fast.rms_norm(x, norm_weight, eps), weight, transposed)

    def normed_swiglu(self, x: mx.array, norm_weight: mx.array, eps: float, weight: mx.array,
                      transposed: mx.array, tensor_map: mx.array | None = None) -> mx.array:
        """swiglu(gate, up) of the normed x's product with gate and up stacked (weight [2 H, K]);
        ``tensor_map``: the weight's, for ops that stream it through TMA (cuda_layer_ops)."""
        gate, up = mx.split(self.normed_matmul(x, norm_weight, eps, weight, transposed), 2, axis=-1)
        return swiglu(gate, up)

    def matmul_add(self, x: mx.array, weight: mx.array, transposed: mx.array, residual: mx.array) -> mx.array:
        """residual + x @ weight.T."""
        return residual + self.matmul(x, weight, transposed)

    def host_bound(self) -> "ComposedOps":
        """The ops for a step whose host, not its GPU, sets the pace (one the fused cascade serves)."""
        return self

    def instance_rows(self, max_rows: int) -> list[int]:
        """Row counts (up to ``max_rows``) at which the projections' kernels are instances of their own, each
        compiled at its first launch: one of each to build them ahead. None for MLX's ops."""
        return []


COMPOSED = ComposedOps()


def layer_ops() -> ComposedOps:
    """The layer ops for this step: the CUDA kernels where the attention
    kernels are the fused CUDA ones, MLX's ops in fewer graph nodes on the CPU
    (``cpu_layer_ops``), else MLX's ops (``MLXCEL_LAYER_OPS=composed`` opts
    out of either). The runner asks once a step."""
    composed = os.environ.get(LAYER_OPS_ENV, "").strip().lower() == "composed"
    cpu = mx.default_device().type == mx.DeviceType.cpu
    # The package's backend choice (MLXCEL_KERNELS) governs these too.
    return chosen_ops(composed, cpu, not cpu and backend_name() == "cuda",
                      os.environ.get(MATMUL_ENV, "").strip().lower())


@functools.cache
def chosen_ops(composed: bool, cpu: bool, cuda: bool, matmul: str) -> ComposedOps:
    # Imported here, once: those modules build on this one (a step's call makes no import).
    if composed or not (cpu or cuda):
        return COMPOSED
    if cpu:
        from .cpu_layer_ops import CPU_OPS
        return CPU_OPS
    from .cuda_layer_ops import cuda_ops
    return cuda_ops(matmul)


def rope_frequencies(rope: nn.Module) -> tuple[mx.array, float, bool] | None:
    """(inverse frequencies [D/2] float32, position scale, traditional) of a rope
    that rotates every dimension with no input scaling, else None."""
    dims, traditional = getattr(rope, "dims", None), getattr(rope, "traditional", None)
    if dims is None or traditional is None:
        return None
    if type(rope) is nn.RoPE:
        half = dims // 2
        inverse = float(rope.base) ** (-np.arange(half) / half)
        return mx.array(inverse, dtype=mx.float32), float(rope.scale), bool(traditional)
    freqs = getattr(rope, "_freqs", None)
    # Llama 3's rope: periods given per pair, positions unscaled, no input scale.
    if type(rope).__name__ == "Llama3RoPE" and freqs is not None:
        return (1.0 / freqs).astype(mx.float32), 1.0, bool(traditional)
    return None


class HeadSplit:
    """One layer's fused q/k/v output [T, (Hq + 2 Hkv) D] -> q [T, Hq, D] and k,
    v [T, Hkv, D], with q and k normalized (when the model has q/k norms) and
    roped at ``positions``."""

    def __init__(self, n_heads: int, n_kv_heads: int, head_dim: int, rope: nn.Module,
                 q_norm: nn.Module | None, k_norm: nn.Module | None) -> None:
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.rope, self.q_norm, self.k_norm = rope, q_norm, k_norm
        q_width, kv_width = n_heads * head_dim, n_kv_heads * head_dim
        self.splits = [q_width, q_width + kv_width]
        self.frequencies = rope_frequencies(rope) if getattr(rope, "dims", None) == head_dim else None
        # Ropes of one key rotate alike (their tables can be shared).
        self.rope_key = None if self.frequencies is None else (
            type(rope).__name__, np.asarray(self.frequencies[0]).tobytes(), *self.frequencies[1:])

    def norms_agree(self) -> bool:
        """Whether q's and k's heads are normalized alike but for their weights (or not at all): MLX's
        RMSNorm, one eps, a weight of head_dim each."""
        if self.q_norm is None:
            return self.k_norm is None
        return (type(self.q_norm) is type(self.k_norm) is nn.RMSNorm and self.q_norm.eps == self.k_norm.eps
                and self.q_norm.weight.shape == self.k_norm.weight.shape == (self.head_dim,))

    def rotate(self, q: mx.array, k: mx.array, v: mx.array,
               positions: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """The composed path from separate projections [T, H * D]."""
        rows, d = q.shape[0], self.head_dim
        q = q.reshape(rows, 1, self.n_heads, d)
        k = k.reshape(rows, 1, self.n_kv_heads, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # One rope over q's and k's heads side by side: it rotates each head alone, so the values are the
        # two calls', and where MLX decomposes it (the CPU) its graph is built once, not twice.
        qk = self.rope(mx.concatenate([q, k], axis=2).transpose(0, 2, 1, 3), offset=positions)[:, :, 0]
        return qk[:, :self.n_heads], qk[:, self.n_heads:], v.reshape(rows, self.n_kv_heads, d)
