"""CUDA spelling of the layer ops (``layer_ops``), one launch each.

add_rms_norm: one block per row; each thread loads its strided elements,
adds them (rounded to the activations' dtype, as MLX's add is) and keeps the
sums in registers, writes them, and after the block's sum of squares writes
their norm.

split_heads: one warp per (row, head) of the fused q/k/v output, D/32
contiguous elements a lane; k and v rows go to the k/v outputs or straight
into the pool's slots (the pool's buffer is written in place: layer_ops says
why and what orders it). A q or k head is normalized (warp sum of
squares; the result rounded to the dtype, as MLX's rms_norm returns it),
then roped in float32: the half-split layout pairs lane l with lane l ^ 16,
the traditional one pairs neighbours inside a lane. The angle is reduced
modulo 2 pi before sincosf so that positions of long contexts keep their
accuracy whatever math flags the compiler gets.

Into a quantized pool (kv_quant's int8 or int4 pages) the k head (as roped,
rounded to the dtype) and the v head are quantized as they are stored,
exactly as ``kv_quant.quantize`` does: int8 takes the head's max |x| across
the warp, int4 each 32-channel group's min and max across its 32 / (D/32)
lanes (so int4 needs D/32 even and dividing 32: D of 64, 128 or 256); the
divisions are IEEE (``__fdiv_rn``) so that no math flag moves a code. Float
pools compile to the same code as without quantization (a template branch).
"""

from __future__ import annotations

import hashlib

import mlx.core as mx

from . import cuda_matmul
from .cuda import float_bits, make_kernel
from .fused import compact_source
from .kv_quant import Pages, QuantizedPages
from .layer_ops import ComposedOps, HeadSplit, PoolSlots

THREADS = 256
MAX_PER_THREAD = 64       # a row's elements a thread keeps in registers (widths up to 16384)
ELEMENT_DTYPES = (mx.bfloat16, mx.float16, mx.float32)
MAX_HEAD_DIM = 256

LIBRARY = r"""
namespace mlxcel_layer {

__device__ __forceinline__ float warp_sum(float v) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T, typename TW, int THREADS, int PER, int EPS_BITS, typename S>
__device__ __forceinline__ void add_rms_norm(const T* residual, const S& residual_shape, int residual_ndim,
                                             const T* delta, const TW* weight, T* out_sum, T* out_norm) {
  __shared__ float partial[THREADS / 32];
  const int width = residual_shape[residual_ndim - 1];   // a row per block, whatever the leading axes
  const size_t base = size_t(blockIdx.x) * width;
  // Every load first (PER independent pairs in flight), then the stores.
  float sum[PER];
  float squares = 0.f;
  #pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = threadIdx.x + j * THREADS;
    sum[j] = i < width ? static_cast<float>(static_cast<T>(static_cast<float>(residual[base + i]) +
                                                           static_cast<float>(delta[base + i])))
                       : 0.f;
    squares += sum[j] * sum[j];
  }
  #pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = threadIdx.x + j * THREADS;
    if (i < width) out_sum[base + i] = static_cast<T>(sum[j]);
  }
  squares = warp_sum(squares);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = squares;
  __syncthreads();
  float total = 0.f;
  #pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) total += partial[w];
  const float inv = rsqrtf(total / width + __int_as_float(EPS_BITS));
  #pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = threadIdx.x + j * THREADS;
    if (i < width) out_norm[base + i] = static_cast<T>(static_cast<float>(weight[i]) * (sum[j] * inv));
  }
}

// x - k 2 pi in two steps (Cody-Waite): 6.28125 has few bits, so k * 6.28125 is exact.
__device__ __forceinline__ float reduce_angle(float x) {
  const float k = rintf(x * 0.15915494309189535f);
  return fmaf(-k, 1.9353071795864769e-3f, fmaf(-k, 6.28125f, x));
}

// One layer's pool of keys (or values) as the store writes it (kv_quant's layouts): float elements
// (QUANT 0, codes only), int8 codes and float16 scales (QUANT 8), packed int4 codes, scales, zeros (QUANT 4).
template <typename TP>
struct Pool {
  const TP* codes;
  const __half* scales;
  const __half* zeros;
};

// N bytes at dst (N-aligned): one store where N is 2, 4 or 8.
template <int N>
__device__ __forceinline__ void store_bytes(uint8_t* dst, const uint32_t (&b)[N]) {
  if constexpr (N == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24,
                                                b[4] | b[5] << 8 | b[6] << 16 | b[7] << 24);
  } else if constexpr (N == 4) {
    *reinterpret_cast<uint32_t*>(dst) = b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24;
  } else if constexpr (N == 2) {
    *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(b[0] | b[1] << 8);
  } else {
    #pragma unroll
    for (int k = 0; k < N; ++k) dst[k] = static_cast<uint8_t>(b[k]);
  }
}

// round(x / step) clipped to [lo, hi], as kv_quant.quantize computes it: an IEEE division (__fdiv_rn: the
// same under any math flags), round half to even (rintf), a scale that is not positive dividing by 1.
__device__ __forceinline__ uint32_t code(float x, float step, float lo, float hi) {
  const float c = fminf(fmaxf(rintf(__fdiv_rn(x, step > 0.f ? step : 1.f)), lo), hi);
  return static_cast<uint32_t>(static_cast<int>(c)) & 0xffu;
}

// One (row, KV head)'s K or V, D/32 channels a lane in x, quantized into its pool slot (slot_head =
// slot * HKV + kv_head) as kv_quant.quantize does, in float32: int8 over the head (a warp max), int4 over
// each 32 channels (the min and max across the group's lanes).
template <int QUANT, int D, typename TP>
__device__ __forceinline__ void store_quantized(const Pool<TP>& pool, size_t slot_head, int lane,
                                                const float (&x)[D / 32]) {
  constexpr int VEC = D / 32;
  uint8_t* codes = reinterpret_cast<uint8_t*>(const_cast<TP*>(pool.codes));
  __half* scales = const_cast<__half*>(pool.scales);
  if constexpr (QUANT == 8) {
    float amax = 0.f;
    #pragma unroll
    for (int k = 0; k < VEC; ++k) amax = fmaxf(amax, fabsf(x[k]));
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const __half scale = __float2half_rn(__fdiv_rn(amax, 127.f));
    const float step = __half2float(scale);
    uint32_t bytes[VEC];
    #pragma unroll
    for (int k = 0; k < VEC; ++k) bytes[k] = code(x[k], step, -127.f, 127.f);
    store_bytes(codes + slot_head * D + lane * VEC, bytes);
    if (lane == 0) scales[slot_head] = scale;
  } else {
    static_assert(QUANT == 4 && VEC % 2 == 0 && 32 % VEC == 0, "int4: whole bytes a lane, whole lanes a group");
    constexpr int LANES = 32 / VEC;                    // a group's lanes: aligned, so xor offsets stay inside
    float lo = x[0], hi = x[0];
    #pragma unroll
    for (int k = 1; k < VEC; ++k) lo = fminf(lo, x[k]), hi = fmaxf(hi, x[k]);
    #pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) {
      lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
      hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    const __half zero = __float2half_rn(lo);
    const float z = __half2float(zero);
    const __half scale = __float2half_rn(__fdiv_rn(hi - z, 15.f));
    const float step = __half2float(scale);
    uint32_t bytes[VEC / 2];
    #pragma unroll
    for (int k = 0; k < VEC; k += 2) {                 // channel 2i in the low nibble
      bytes[k / 2] = code(x[k] - z, step, 0.f, 15.f) | code(x[k + 1] - z, step, 0.f, 15.f) << 4;
    }
    store_bytes(codes + slot_head * (D / 2) + lane * (VEC / 2), bytes);
    if (lane % LANES == 0) {
      const size_t group = slot_head * (D / 32) + lane / LANES;
      scales[group] = scale;
      const_cast<__half*>(pool.zeros)[group] = zero;
    }
  }
}

template <typename T, typename TW, typename TP, int D, int HQ, int HKV, bool NORM, bool TRADITIONAL, bool STORE,
          int QUANT, int BLOCK, int EPS_BITS, int SCALE_BITS, typename S>
__device__ __forceinline__ void split_heads(const T* qkv, const S& qkv_shape, const TW* q_weight,
                                            const TW* k_weight, const int32_t* positions, const float* inv_freq,
                                            const int32_t* slot_blocks, const int32_t* slot_offsets,
                                            const Pool<TP> k_pool, const Pool<TP> v_pool, T* q_out, TP* k_out,
                                            TP* v_out) {
  constexpr int VEC = D / 32;
  constexpr int HEADS = HQ + 2 * HKV;
  const int rows = qkv_shape[0];
  const size_t item = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (item >= size_t(rows) * HEADS) return;          // whole warps leave together
  const int row = item / HEADS, head = item % HEADS;
  const T* src = qkv + item * D + lane * VEC;
  const bool is_q = head < HQ, is_v = head >= HQ + HKV;
  const int kv_head = is_v ? head - HQ - HKV : head - HQ;
  // K and V rows: the pool's slot (the pool is written in place: see layer_ops) or the k/v outputs; a
  // quantized pool's slot (slot_head) is addressed by store_quantized.
  TP* kv_dst = nullptr;
  size_t slot_head = 0;
  if (!is_q) {
    TP* base = STORE ? const_cast<TP*>(is_v ? v_pool.codes : k_pool.codes) : (is_v ? v_out : k_out);
    const size_t slot = STORE ? size_t(slot_blocks[row]) * BLOCK + slot_offsets[row] : size_t(row);
    slot_head = slot * HKV + kv_head;
    if constexpr (QUANT == 0) kv_dst = base + slot_head * D + lane * VEC;
  }
  if (is_v) {
    if constexpr (QUANT != 0) {
      float x[VEC];
      #pragma unroll
      for (int k = 0; k < VEC; ++k) x[k] = static_cast<float>(src[k]);
      store_quantized<QUANT, D>(v_pool, slot_head, lane, x);
    } else {
      #pragma unroll
      for (int k = 0; k < VEC; ++k) kv_dst[k] = static_cast<TP>(static_cast<float>(src[k]));
    }
    return;
  }
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
  if (is_q) {
    T* dst = q_out + (size_t(row) * HQ + head) * D + lane * VEC;
    #pragma unroll
    for (int k = 0; k < VEC; ++k) dst[k] = static_cast<T>(y[k]);
  } else if constexpr (QUANT != 0) {
    // Quantized from the rope's output in the activations' dtype, as the composed store quantizes it.
    #pragma unroll
    for (int k = 0; k < VEC; ++k) y[k] = static_cast<float>(static_cast<T>(y[k]));
    store_quantized<QUANT, D>(k_pool, slot_head, lane, y);
  } else {
    // Rounded to the activations' dtype first, as the rope's output is before the pool's cast.
    #pragma unroll
    for (int k = 0; k < VEC; ++k) kv_dst[k] = static_cast<TP>(static_cast<float>(static_cast<T>(y[k])));
  }
}

}  // namespace mlxcel_layer
"""

ADD_RMS_NORM_CALL = ("mlxcel_layer::add_rms_norm<T, TW, THREADS, PER, EPS_BITS>(residual, residual_shape, "
                     "residual_ndim, delta, "
                     "weight, out_sum, out_norm);")
SPLIT_INPUTS = ["qkv", "q_weight", "k_weight", "positions", "inv_freq"]


def split_heads_call(quant: int | None) -> str:
    """The kernel's call: k and v to outputs (``quant`` None), or stored into
    float pools (0) or int8 (8) or int4 (4) pages."""
    def pool(side: str) -> str:
        if quant is None:
            return "mlxcel_layer::Pool<T>{nullptr, nullptr, nullptr}"
        if quant == 0:
            return f"mlxcel_layer::Pool<TP>{{{side}_pool, nullptr, nullptr}}"
        zeros = f"{side}_zeros" if quant == 4 else "nullptr"
        return f"mlxcel_layer::Pool<TP>{{{side}_codes, {side}_scales, {zeros}}}"

    if quant is None:
        return ("mlxcel_layer::split_heads<T, TW, T, D, HQ, HKV, NORM, TRADITIONAL, false, 0, 1, EPS_BITS, "
                "SCALE_BITS>(qkv, qkv_shape, q_weight, k_weight, positions, inv_freq, (const int32_t*)nullptr, "
                f"(const int32_t*)nullptr, {pool('k')}, {pool('v')}, q_out, k_out, v_out);")
    return (f"mlxcel_layer::split_heads<T, TW, TP, D, HQ, HKV, NORM, TRADITIONAL, true, {quant}, BLOCK, EPS_BITS, "
            "SCALE_BITS>(qkv, qkv_shape, q_weight, k_weight, positions, inv_freq, slot_blocks, slot_offsets, "
            f"{pool('k')}, {pool('v')}, q_out, (TP*)nullptr, (TP*)nullptr);")


def store_inputs(quant: int) -> list[str]:
    """The store kernel's inputs: the split's, the slots, then each pool's parts (``split_heads_call``'s names)."""
    parts = {0: ["pool"], 8: ["codes", "scales"], 4: ["codes", "scales", "zeros"]}[quant]
    return SPLIT_INPUTS + ["slot_blocks", "slot_offsets"] + [f"{side}_{part}" for side in "kv" for part in parts]


def pool_store(pool: Pages, head_dim: int) -> int | None:
    """The store kernel's QUANT for this pool: 0 (float elements), 8 or 4
    (kv_quant's int8 or int4 pages), or None where it cannot store them (the
    composed store does)."""
    if not isinstance(pool, QuantizedPages):
        return 0 if pool.dtype in ELEMENT_DTYPES else None
    fmt, per_lane = pool.format, head_dim // 32
    if fmt.affine and (fmt.group != 32 or per_lane % 2 or 32 % per_lane):   # whole bytes a lane, lanes a group
        return None
    return fmt.bits


def make_layer_kernel(kind: str, inputs: list[str], outputs: list[str], call: str):
    # The digest names the kernel: MLX caches compiled kernels by name.
    digest = hashlib.sha1((LIBRARY + call).encode()).hexdigest()[:12]
    return make_kernel(f"mlxcel_{kind}_{digest}", inputs, outputs, call, compact_source(LIBRARY), 0)


class CudaOps(ComposedOps):
    """The fused kernels where they take the arrays, MLX's ops elsewhere; with ``skinny_matmuls`` a float
    projection over a decode step's rows is cuda_matmul's kernel, else MLX's (cuBLAS); with ``tma`` a weight's
    tensor map, where its Linear has one (gate/up's on Hopper), streams it through TMA. ``host_bound_ops``:
    the ops of this step's host-bound layers (``host_bound``; None: these)."""

    stores_in_place = True

    def __init__(self, skinny_matmuls: bool, host_bound_ops: "CudaOps | None" = None, tma: bool = True) -> None:
        self._kernels: dict[str, object] = {}
        self.skinny_matmuls = skinny_matmuls
        self.tma = tma
        self._host_bound = host_bound_ops or self

    def matmul(self, x: mx.array, weight: mx.array, transposed: mx.array) -> mx.array:
        if self.skinny_matmuls and cuda_matmul.takes(x, weight):
            return cuda_matmul.skinny_matmul(x, weight)
        return x @ transposed

    def folds(self, x: mx.array, weight: mx.array) -> bool:
        return self.skinny_matmuls and cuda_matmul.takes(x, weight)

    def normed_matmul(self, x: mx.array, norm_weight: mx.array, eps: float, weight: mx.array,
                      transposed: mx.array) -> mx.array:
        if self.folds(x, weight) and cuda_matmul.takes_norm(x, norm_weight):
            return cuda_matmul.skinny_matmul(x, weight, norm=(norm_weight, eps))
        return super().normed_matmul(x, norm_weight, eps, weight, transposed)

    def normed_swiglu(self, x: mx.array, norm_weight: mx.array, eps: float, weight: mx.array,
                      transposed: mx.array, tensor_map: mx.array | None = None) -> mx.array:
        if self.folds(x, weight) and cuda_matmul.takes_norm(x, norm_weight) and weight.shape[0] % 16 == 0:
            return cuda_matmul.skinny_matmul(x, weight, norm=(norm_weight, eps), swiglu=True,
                                             tensor_map=tensor_map if self.tma else None)
        return super().normed_swiglu(x, norm_weight, eps, weight, transposed)

    def matmul_add(self, x: mx.array, weight: mx.array, transposed: mx.array, residual: mx.array) -> mx.array:
        if (self.folds(x, weight) and residual.dtype == x.dtype
                and residual.shape == (*x.shape[:-1], weight.shape[0])):
            return cuda_matmul.skinny_matmul(x, weight, residual=residual)
        return super().matmul_add(x, weight, transposed, residual)

    def host_bound(self) -> ComposedOps:
        return self._host_bound

    def instance_rows(self, max_rows: int) -> list[int]:
        return cuda_matmul.instance_rows(max_rows) if self.skinny_matmuls else []

    def _kernel(self, kind: str, inputs: list[str], outputs: list[str], call: str):
        kernel = self._kernels.get(kind)
        if kernel is None:
            kernel = self._kernels[kind] = make_layer_kernel(kind, inputs, outputs, call)
        return kernel

    def add_rms_norm(self, residual: mx.array, delta: mx.array, weight: mx.array,
                     eps: float) -> tuple[mx.array, mx.array]:
        shape, width = residual.shape, residual.shape[-1]
        per_thread = -(-width // THREADS)
        if (residual.dtype not in ELEMENT_DTYPES or delta.dtype != residual.dtype or weight.ndim != 1
                or per_thread > MAX_PER_THREAD):
            return super().add_rms_norm(residual, delta, weight, eps)
        rows = residual.size // width
        kernel = self._kernel("add_rms_norm", ["residual", "delta", "weight"], ["out_sum", "out_norm"],
                              ADD_RMS_NORM_CALL)
        # The arrays as they come ([T, 1, hidden]): a reshape is one more op for the host to build and encode.
        total, normed = kernel(
            inputs=[residual, delta, weight],
            template=[("T", residual.dtype), ("TW", weight.dtype), ("THREADS", THREADS), ("PER", per_thread),
                      ("EPS_BITS", float_bits(eps))],
            grid=(rows * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
            output_shapes=[shape, shape], output_dtypes=[residual.dtype, residual.dtype])
        return total, normed

    def split_heads(self, heads: HeadSplit, qkv: mx.array, positions: mx.array, slots: PoolSlots | None = None,
                    rope: tuple[mx.array, mx.array] | None = None) -> tuple[mx.array, mx.array | None, mx.array | None]:
        d = heads.head_dim
        if (heads.frequencies is None or qkv.dtype not in ELEMENT_DTYPES or d % 32 or d > MAX_HEAD_DIM
                or (heads.frequencies[2] and d % 64)):                 # traditional pairs stay inside a lane
            return super().split_heads(heads, qkv, positions, slots)
        quant = None if slots is None else pool_store(slots.keys, d)
        if slots is not None and quant is None:
            return super().split_heads(heads, qkv, positions, slots)
        inv_freq, position_scale, traditional = heads.frequencies
        rows, hq, hkv = qkv.shape[0], heads.n_heads, heads.n_kv_heads
        norm = heads.q_norm is not None
        weights = (heads.q_norm.weight, heads.k_norm.weight) if norm else (inv_freq, inv_freq)  # unread without norms
        template = [("T", qkv.dtype), ("TW", weights[0].dtype), ("D", d), ("HQ", hq), ("HKV", hkv),
                    ("NORM", norm), ("TRADITIONAL", traditional),
                    ("EPS_BITS", float_bits(heads.q_norm.eps if norm else 0.0)),
                    ("SCALE_BITS", float_bits(position_scale))]
        inputs = [qkv, *weights, positions.astype(mx.int32), inv_freq]   # qkv [T, 1, width]: rows lead
        launch = dict(grid=(-(-rows * (hq + 2 * hkv) // 4) * 128, 1, 1), threadgroup=(128, 1, 1))
        if slots is None:
            q, k, v = self._kernel("split_heads", SPLIT_INPUTS, ["q_out", "k_out", "v_out"], split_heads_call(None))(
                inputs=inputs, template=template, output_shapes=[(rows, hq, d), (rows, hkv, d), (rows, hkv, d)],
                output_dtypes=[qkv.dtype] * 3, **launch)
            return q, k, v
        pools = [slots.keys, slots.values] if quant == 0 else [part for pages in (slots.keys, slots.values)
                                                                for part in pages if part is not None]
        q, = self._kernel(f"split_heads_store{quant}", store_inputs(quant), ["q_out"], split_heads_call(quant))(
            inputs=inputs + [slots.blocks, slots.offsets, *pools],
            template=template + [("TP", slots.keys.dtype), ("BLOCK", slots.keys.shape[1])],
            output_shapes=[(rows, hq, d)], output_dtypes=[qkv.dtype], **launch)
        return q, None, None


CUDA_SKINNY_OPS = CudaOps(skinny_matmuls=True)
CUDA_CUBLAS_OPS = CudaOps(skinny_matmuls=False)
CUDA_OPS = CudaOps(skinny_matmuls=False, host_bound_ops=CUDA_SKINNY_OPS)
CUDA_NO_TMA_OPS = CudaOps(skinny_matmuls=False, host_bound_ops=CudaOps(skinny_matmuls=True, tma=False))


def cuda_ops(matmul: str) -> CudaOps:
    """The CUDA ops for an ``MLXCEL_MATMUL`` choice: the skinny kernels in host-bound steps (the default),
    ``skinny`` in every decode step, ``cublas`` in none, ``no-tma`` as the default with gate/up on the skinny
    kernel rather than its TMA-fed one."""
    return {"skinny": CUDA_SKINNY_OPS, "cublas": CUDA_CUBLAS_OPS, "no-tma": CUDA_NO_TMA_OPS}.get(matmul, CUDA_OPS)
