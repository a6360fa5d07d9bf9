"""CUDA spelling of the layer ops (``layer_ops``), one launch each.

add_rms_norm: one block per row; each thread adds its strided elements
(rounded to the activations' dtype, as MLX's add is), sums their squares,
writes the sum; after the block's reduction it reads its own elements back
and writes the norm.

split_heads: one warp per (row, head) of the fused q/k/v output, D/32
contiguous elements a lane. A q or k head is normalized (warp sum of
squares; the result rounded to the dtype, as MLX's rms_norm returns it),
then roped in float32: the half-split layout pairs lane l with lane l ^ 16,
the traditional one pairs neighbours inside a lane. The angle is reduced
modulo 2 pi before sincosf so that positions of long contexts keep their
accuracy whatever math flags the compiler gets.
"""

from __future__ import annotations

import hashlib
import struct

import mlx.core as mx

from .cuda import make_kernel
from .fused import compact_source
from .layer_ops import ComposedOps, HeadSplit

THREADS = 256
ELEMENT_DTYPES = (mx.bfloat16, mx.float16, mx.float32)
MAX_HEAD_DIM = 256

LIBRARY = r"""
namespace mlxcel_layer {

__device__ __forceinline__ float warp_sum(float v) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T, typename TW, int THREADS, int EPS_BITS, typename S>
__device__ __forceinline__ void add_rms_norm(const T* residual, const S& residual_shape, const T* delta,
                                             const TW* weight, T* out_sum, T* out_norm) {
  __shared__ float partial[THREADS / 32];
  const int width = residual_shape[1];
  const size_t base = size_t(blockIdx.x) * width;
  float squares = 0.f;
  for (int i = threadIdx.x; i < width; i += THREADS) {
    const T sum = static_cast<T>(static_cast<float>(residual[base + i]) + static_cast<float>(delta[base + i]));
    out_sum[base + i] = sum;
    const float s = static_cast<float>(sum);
    squares += s * s;
  }
  squares = warp_sum(squares);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = squares;
  __syncthreads();
  float total = 0.f;
  #pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) total += partial[w];
  const float inv = rsqrtf(total / width + __int_as_float(EPS_BITS));
  for (int i = threadIdx.x; i < width; i += THREADS) {   // this thread's own writes: no barrier needed
    const float s = static_cast<float>(out_sum[base + i]);
    out_norm[base + i] = static_cast<T>(static_cast<float>(weight[i]) * (s * inv));
  }
}

// x - k 2 pi in two steps (Cody-Waite): 6.28125 has few bits, so k * 6.28125 is exact.
__device__ __forceinline__ float reduce_angle(float x) {
  const float k = rintf(x * 0.15915494309189535f);
  return fmaf(-k, 1.9353071795864769e-3f, fmaf(-k, 6.28125f, x));
}

template <typename T, typename TW, int D, int HQ, int HKV, bool NORM, bool TRADITIONAL, int EPS_BITS,
          int SCALE_BITS, typename S>
__device__ __forceinline__ void split_heads(const T* qkv, const S& qkv_shape, const TW* q_weight,
                                            const TW* k_weight, const int32_t* positions,
                                            const float* inv_freq, T* q_out, T* k_out, T* v_out) {
  constexpr int VEC = D / 32;
  constexpr int HEADS = HQ + 2 * HKV;
  const int rows = qkv_shape[0];
  const size_t item = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (item >= size_t(rows) * HEADS) return;          // whole warps leave together
  const int row = item / HEADS, head = item % HEADS;
  const T* src = qkv + item * D + lane * VEC;
  if (head >= HQ + HKV) {                             // a v head: copied as it is
    T* dst = v_out + (size_t(row) * HKV + head - HQ - HKV) * D + lane * VEC;
    #pragma unroll
    for (int k = 0; k < VEC; ++k) dst[k] = src[k];
    return;
  }
  const bool is_q = head < HQ;
  float x[VEC];
  #pragma unroll
  for (int k = 0; k < VEC; ++k) x[k] = static_cast<float>(src[k]);
  if (NORM) {
    float squares = 0.f;
    #pragma unroll
    for (int k = 0; k < VEC; ++k) squares += x[k] * x[k];
    const float inv = rsqrtf(warp_sum(squares) / D + __int_as_float(EPS_BITS));
    const TW* w = (is_q ? q_weight : k_weight) + lane * VEC;
    #pragma unroll
    for (int k = 0; k < VEC; ++k) x[k] = static_cast<float>(static_cast<T>(static_cast<float>(w[k]) * (x[k] * inv)));
  }
  const float position = static_cast<float>(positions[row]) * __int_as_float(SCALE_BITS);
  float y[VEC];
  if (TRADITIONAL) {                                  // pairs (2j, 2j + 1), inside the lane
    #pragma unroll
    for (int k = 0; k < VEC; k += 2) {
      float s, c;
      sincosf(reduce_angle(position * inv_freq[(lane * VEC + k) / 2]), &s, &c);
      y[k] = x[k] * c - x[k + 1] * s;
      y[k + 1] = x[k] * s + x[k + 1] * c;
    }
  } else {                                            // pairs (j, j + D/2): lanes l and l ^ 16
    const bool low = lane < 16;
    #pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float other = __shfl_xor_sync(0xffffffffu, x[k], 16);
      float s, c;
      sincosf(reduce_angle(position * inv_freq[(lane % 16) * VEC + k]), &s, &c);
      y[k] = low ? x[k] * c - other * s : other * s + x[k] * c;
    }
  }
  T* dst = (is_q ? q_out + (size_t(row) * HQ + head) * D : k_out + (size_t(row) * HKV + head - HQ) * D) + lane * VEC;
  #pragma unroll
  for (int k = 0; k < VEC; ++k) dst[k] = static_cast<T>(y[k]);
}

}  // namespace mlxcel_layer
"""

ADD_RMS_NORM_CALL = ("mlxcel_layer::add_rms_norm<T, TW, THREADS, EPS_BITS>(residual, residual_shape, delta, "
                     "weight, out_sum, out_norm);")
SPLIT_HEADS_CALL = ("mlxcel_layer::split_heads<T, TW, D, HQ, HKV, NORM, TRADITIONAL, EPS_BITS, SCALE_BITS>(qkv, "
                    "qkv_shape, q_weight, k_weight, positions, inv_freq, q_out, k_out, v_out);")


def float_bits(value: float) -> int:
    """A float32 as a template int (the kernels read it back with __int_as_float)."""
    return struct.unpack("<i", struct.pack("<f", float(value)))[0]


def _kernel(kind: str, inputs: list[str], outputs: list[str], call: str):
    # The digest names the kernel: MLX caches compiled kernels by name.
    digest = hashlib.sha1((LIBRARY + call).encode()).hexdigest()[:12]
    return make_kernel(f"mlxcel_{kind}_{digest}", inputs, outputs, call, compact_source(LIBRARY), 0)


class CudaOps(ComposedOps):
    """The fused kernels where they take the arrays, MLX's ops elsewhere."""

    def __init__(self) -> None:
        self._add_rms_norm = None
        self._split_heads = None

    def add_rms_norm(self, residual: mx.array, delta: mx.array, weight: mx.array,
                     eps: float) -> tuple[mx.array, mx.array]:
        if residual.dtype not in ELEMENT_DTYPES or delta.dtype != residual.dtype or weight.ndim != 1:
            return super().add_rms_norm(residual, delta, weight, eps)
        if self._add_rms_norm is None:
            self._add_rms_norm = _kernel("add_rms_norm", ["residual", "delta", "weight"], ["out_sum", "out_norm"],
                                         ADD_RMS_NORM_CALL)
        shape, width = residual.shape, residual.shape[-1]
        rows = residual.size // width
        total, normed = self._add_rms_norm(
            inputs=[residual.reshape(rows, width), delta.reshape(rows, width), weight],
            template=[("T", residual.dtype), ("TW", weight.dtype), ("THREADS", THREADS),
                      ("EPS_BITS", float_bits(eps))],
            grid=(rows * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
            output_shapes=[(rows, width), (rows, width)], output_dtypes=[residual.dtype, residual.dtype])
        return total.reshape(shape), normed.reshape(shape)

    def split_heads(self, heads: HeadSplit, qkv: mx.array,
                    positions: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        d = heads.head_dim
        if (heads.frequencies is None or qkv.dtype not in ELEMENT_DTYPES or d % 32 or d > MAX_HEAD_DIM
                or (heads.frequencies[2] and d % 64)):     # traditional pairs stay inside a lane
            return super().split_heads(heads, qkv, positions)
        if self._split_heads is None:
            self._split_heads = _kernel(
                "split_heads", ["qkv", "q_weight", "k_weight", "positions", "inv_freq"], ["q_out", "k_out", "v_out"],
                SPLIT_HEADS_CALL)
        inv_freq, position_scale, traditional = heads.frequencies
        rows, hq, hkv = qkv.shape[0], heads.n_heads, heads.n_kv_heads
        norm = heads.q_norm is not None
        weights = (heads.q_norm.weight, heads.k_norm.weight) if norm else (inv_freq, inv_freq)  # unread without norms
        eps = heads.q_norm.eps if norm else 0.0
        warps = rows * (hq + 2 * hkv)
        q, k, v = self._split_heads(
            inputs=[qkv.reshape(rows, -1), *weights, positions.astype(mx.int32), inv_freq],
            template=[("T", qkv.dtype), ("TW", weights[0].dtype), ("D", d), ("HQ", hq), ("HKV", hkv),
                      ("NORM", norm), ("TRADITIONAL", traditional), ("EPS_BITS", float_bits(eps)),
                      ("SCALE_BITS", float_bits(position_scale))],
            grid=(-(-warps // 4) * 128, 1, 1), threadgroup=(128, 1, 1),
            output_shapes=[(rows, hq, d), (rows, hkv, d), (rows, hkv, d)], output_dtypes=[qkv.dtype] * 3)
        return q, k, v


CUDA_OPS = CudaOps()
