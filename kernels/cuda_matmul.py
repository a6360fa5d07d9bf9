"""A decode step's projections, y = x W^T for a few rows, as one custom launch.

MLX's CUDA backend runs a matmul through cuBLASLt and builds its plan (the
matrix layouts, the algorithm heuristic) on every call: 44-81 us of host time
to encode one on an H200 host, where this kernel's launch costs 26-34
(gpu_matmul_bench.py). A decode step of an 8B model makes four a layer (q/k/v,
o, gate/up, down: 144), and where the fused cascade serves the step the host,
not the GPU, sets its pace. cuBLAS's kernels (TMA, up to 16 stages) stream the
weight faster: this one takes 1.08-1.21x their GPU time at 32 rows, so the
engine uses it only in those host-bound steps (layer_ops.host_bound).

The layout: a block owns ``8 N_TILES`` output columns and all (<= 16
``M_TILES``) rows; its warps split K in 64-wide chunks (warp w takes chunks
w, w + WARPS, ...), each chunk four m16n8k16 tensor-core products per (m, n)
tile. For each of its weight rows and x rows a lane copies two 16-byte pieces
(k 8t..8t+7 and 32+8t..32+8t+7 of the chunk, t = lane % 4: four lanes read a
row's 64 contiguous bytes, whole sectors, twice) into its warp's ring of
STAGES chunks (cp.async, STAGES - 1 in flight) and reads back only what it
copied: the mma's k order is permuted to match (its k 2t, 2t+1, 2t+8, 2t+9
are a piece's first four, the next product's its last four), a sum's order
being free, so no operand is shuffled. The warps' float32 sums meet in shared
memory, are added in warp order (the same order every run) and rounded once
to the output's dtype.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace

import mlx.core as mx

from .cuda import HEADER, make_kernel
from .fused import compact_source

DTYPES = (mx.bfloat16, mx.float16)
CHUNK = 64          # k per warp iteration: a 128-byte line of each weight row, four k16 products
MAX_ROWS = 64       # more rows (a prefill chunk) go to cuBLAS, whose plan is then a small part of the work

LIBRARY = HEADER + r"""
namespace mlxcel_matmul {

// 16 bytes global -> shared, asynchronously (L2 only: nothing here is read twice by one SM); zeros where
// !live (a row or chunk past the end: its products are zeros).
__device__ __forceinline__ void copy16(void* shared, const void* global, bool live) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(mlxcel::shared_address(shared)), "l"(global), "r"(live ? 16 : 0));
}

template <int PENDING>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING));
}

template <typename T, int M_TILES, int N_TILES, int WARPS, int STAGES, typename S>
__device__ __forceinline__ void skinny_matmul(const T* x, const S& x_shape, int x_ndim, const T* w, T* y, int N,
                                              int K) {
  constexpr int PIECES = 2 * (N_TILES + 2 * M_TILES);   // 16-byte pieces a lane stages a chunk: two a row
  static_assert(STAGES >= 2, "a ring of one chunk cannot load ahead");
  constexpr int R = M_TILES * N_TILES * 4;        // a lane's accumulators
  extern __shared__ __align__(16) unsigned char mlxcel_shared[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * N_TILES * 8;
  int M = 1;   // x's leading axes are its rows
  for (int d = 0; d < x_ndim - 1; ++d) M *= x_shape[d];

  // This warp's chunks of K: every WARPS-th from its index.
  const int mine = max(0, (K / 64 - warp + WARPS - 1) / WARPS);

  const T* w_row[N_TILES];
  #pragma unroll
  for (int j = 0; j < N_TILES; ++j) w_row[j] = w + size_t(min(n0 + j * 8 + g, N - 1)) * K + t * 8;
  const T* x_row[M_TILES][2];
  bool x_live[M_TILES][2];
  #pragma unroll
  for (int i = 0; i < M_TILES; ++i)
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = i * 16 + h * 8 + g;
      x_live[i][h] = row < M;
      x_row[i][h] = x + size_t(min(row, M - 1)) * K + t * 8;
    }

  // A warp's ring of STAGES chunks, [stage][piece][lane]: a lane reads back only what it copied.
  uint4* ring = reinterpret_cast<uint4*>(mlxcel_shared) + warp * STAGES * PIECES * 32 + lane;
  auto stage_chunk = [&](int i) {
    const bool live = i < mine;
    const int k = live ? (warp + i * WARPS) * 64 : 0;
    uint4* slot = ring + (i % STAGES) * PIECES * 32;
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
      #pragma unroll
      for (int j = 0; j < N_TILES; ++j) copy16(slot + (half * N_TILES + j) * 32, w_row[j] + k + half * 32, live);
      #pragma unroll
      for (int i2 = 0; i2 < M_TILES; ++i2)
        #pragma unroll
        for (int h = 0; h < 2; ++h)
          copy16(slot + (2 * N_TILES + (half * M_TILES + i2) * 2 + h) * 32, x_row[i2][h] + k + half * 32,
                 live && x_live[i2][h]);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };

  float acc[M_TILES][N_TILES][4];
  #pragma unroll
  for (int i = 0; i < M_TILES; ++i)
    #pragma unroll
    for (int j = 0; j < N_TILES; ++j)
      #pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

  #pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) stage_chunk(s);
  for (int c = 0; c < mine; ++c) {
    wait_copies<STAGES - 2>();       // chunk c has landed
    stage_chunk(c + STAGES - 1);     // into the stage chunk c - 1 left (its products are issued)
    const uint4* slot = ring + (c % STAGES) * PIECES * 32;
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
      uint4 wv[N_TILES], xv[M_TILES][2];
      #pragma unroll
      for (int j = 0; j < N_TILES; ++j) wv[j] = slot[(half * N_TILES + j) * 32];
      #pragma unroll
      for (int i = 0; i < M_TILES; ++i)
        #pragma unroll
        for (int h = 0; h < 2; ++h) xv[i][h] = slot[(2 * N_TILES + (half * M_TILES + i) * 2 + h) * 32];
      #pragma unroll
      for (int i = 0; i < M_TILES; ++i) {
        const uint32_t a0[4] = {xv[i][0].x, xv[i][1].x, xv[i][0].y, xv[i][1].y};
        const uint32_t a1[4] = {xv[i][0].z, xv[i][1].z, xv[i][0].w, xv[i][1].w};
        #pragma unroll
        for (int j = 0; j < N_TILES; ++j) {
          mlxcel::Mma<T>::run(acc[i][j], a0, wv[j].x, wv[j].y);
          mlxcel::Mma<T>::run(acc[i][j], a1, wv[j].z, wv[j].w);
        }
      }
    }
  }
  wait_copies<0>();
  __syncthreads();                  // the rings are done with: their memory takes the warps' sums

  float* sums = reinterpret_cast<float*>(mlxcel_shared);   // [WARPS][R][32]
  #pragma unroll
  for (int i = 0; i < M_TILES; ++i)
    #pragma unroll
    for (int j = 0; j < N_TILES; ++j)
      #pragma unroll
      for (int q = 0; q < 4; ++q) sums[(warp * R + (i * N_TILES + j) * 4 + q) * 32 + lane] = acc[i][j][q];
  __syncthreads();
  // Element e: accumulator pair (q, q + 1) of lane e % 32, two neighbouring columns of one row.
  for (int e = threadIdx.x; e < R / 2 * 32; e += WARPS * 32) {
    const int r = e / 32 * 2, l = e % 32, q = r % 4, j = (r / 4) % N_TILES, i = r / (4 * N_TILES);
    float lo = 0.f, hi = 0.f;
    #pragma unroll
    for (int v = 0; v < WARPS; ++v) {
      lo += sums[(v * R + r) * 32 + l];
      hi += sums[(v * R + r + 1) * 32 + l];
    }
    const int row = i * 16 + l / 4 + (q ? 8 : 0), col = n0 + j * 8 + (l % 4) * 2;
    if (row < M && col < N) {
      y[size_t(row) * N + col] = static_cast<T>(lo);
      y[size_t(row) * N + col + 1] = static_cast<T>(hi);
    }
  }
}

}  // namespace mlxcel_matmul
"""

CALL = ("mlxcel_matmul::skinny_matmul<T, M_TILES, N_TILES, WARPS, STAGES>(x, x_shape, x_ndim, w, y, w_shape[0], "
        "w_shape[1]);")
SHARED_LIMIT = 227 << 10     # an H100's / H200's shared memory a block may opt into


@dataclass(frozen=True)
class Tiles:
    """A launch's shape: rows in 16-row tiles, a block's columns in 8-column tiles, the block's warps
    splitting K, each with a ring of ``stages`` chunks in flight."""

    m_tiles: int
    n_tiles: int = 8
    warps: int = 4
    stages: int = 3

    @property
    def shared_bytes(self) -> int:
        ring = self.warps * self.stages * 2 * (self.n_tiles + 2 * self.m_tiles) * 32 * 16
        return max(ring, self.warps * self.m_tiles * self.n_tiles * 4 * 32 * 4)

    def blocks(self, n: int) -> int:
        return -(-n // (8 * self.n_tiles))


def tiles_for(rows: int, n: int) -> Tiles:
    """The launch for ``rows`` x ``n``: 64 columns a block and 4 warps where that makes at least 96 blocks
    (of an H200's 132 SMs), else 32 columns and 8 warps; each warp a ring of 3 chunks. Where the rows'
    pieces would overfill the shared memory, fewer warps first (each keeps its chunks in flight), then fewer
    stages. At 32 rows the sweep's best for each 8B layer shape (gpu_matmul_bench.py --sweep on an H200)."""
    tiles = Tiles(-(-rows // 16)) if n >= 96 * 64 else Tiles(-(-rows // 16), n_tiles=4, warps=8)
    while tiles.shared_bytes > SHARED_LIMIT:
        tiles = replace(tiles, warps=tiles.warps // 2) if tiles.warps > 4 else replace(tiles, stages=tiles.stages - 1)
    return tiles


@functools.lru_cache(maxsize=None)
def kernel_for(shared_bytes: int):
    # The digest names the kernel: MLX caches compiled kernels by name (the template's constants apart).
    digest = hashlib.sha1((LIBRARY + CALL).encode()).hexdigest()[:12]
    return make_kernel(f"mlxcel_skinny_matmul_{digest}_{shared_bytes}", ["x", "w"], ["y"], CALL,
                       compact_source(LIBRARY), shared_bytes)


def takes(x: mx.array, weight: mx.array) -> bool:
    """Whether ``skinny_matmul`` computes x @ weight.T: a 16-bit weight [N, K]
    of x's dtype, N in whole 8-column tiles, K in whole chunks, 1 to MAX_ROWS rows of x."""
    n, k = weight.shape if weight.ndim == 2 else (0, 0)
    return (weight.dtype in DTYPES and x.dtype == weight.dtype and x.shape[-1] == k and k > 0 and k % CHUNK == 0
            and n % 8 == 0 and 0 < x.size // k <= MAX_ROWS)


def skinny_matmul(x: mx.array, weight: mx.array, tiles: Tiles | None = None) -> mx.array:
    """x [..., K] @ weight.T for a weight [N, K] that ``takes`` accepts."""
    n, k = weight.shape
    tiles = tiles or tiles_for(x.size // k, n)
    y, = kernel_for(tiles.shared_bytes)(
        inputs=[x, weight],
        template=[("T", x.dtype), ("M_TILES", tiles.m_tiles), ("N_TILES", tiles.n_tiles), ("WARPS", tiles.warps),
                  ("STAGES", tiles.stages)],
        grid=(tiles.blocks(n) * tiles.warps * 32, 1, 1), threadgroup=(tiles.warps * 32, 1, 1),
        output_shapes=[(*x.shape[:-1], n)], output_dtypes=[x.dtype])
    return y
