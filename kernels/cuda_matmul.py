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
to the output's dtype. Where one tile a block would take several waves of
blocks (``Tiles.loop``), a block loops over column tiles instead, its warps'
rings running on into the next tile's chunks while a tile's sums are added
(their shared memory beside the rings, not in them).

``producer_matmul`` (``Tiles.producer``) is the warp-specialized variant, as
cuBLAS's nvjet and CUTLASS's warp-specialized kernels split the work: a
block's last warp only copies, each 64-k chunk of the block's weight rows as
two boxes through the weight's TMA tensor map (``tensor_maps``: the copy
engine moves a box in one instruction, 128-byte swizzled) and x's rows (and
the norm's weight) by its lanes' cp.async into the same swizzle, each chunk
handed over by mbarriers; its other warps only compute, warp w taking a
tile's chunks w, w + WARPS, ... as skinny_matmul's warps take theirs, reading
them with ldmatrix, their sums meeting at a tile's end. Where a weight has
64-column tiles for two or more a block (``takes_tensor_map``: gate/up's),
the engine makes its map at load (model.Linear) and its decode products of
32 rows or fewer run here: 76 us a call against 83 in an H100's decode step;
with fewer tiles (q/k/v, o, down) the copy warp's x copies are
as many bytes as the weight's and it is slower. ``tiles_for`` gives it every
launch only with ``PRODUCER`` set (a sweep's switch).

A decoder layer's ops around its projections ride along where the step's
ops fold them (layer_ops, ``folds``): each is one launch less a layer for
the host to encode and the GPU to run (a separate add+norm kernel took ~8 us
of GPU time at 32 rows, its encode ~10 us of the host's):

- ``norm``: x is the residual stream, RMS-normalized on the way in. Each
  lane scales the x pieces it holds by the norm's weight (staged with them)
  before they become operands (one rounding, as the norm's own), and the
  tensor cores sum their squares (x X^T's diagonal, from the same
  registers); a row's 1/rms, known only once every chunk is read, multiplies
  its sums at the end (a per-row factor commutes with the product). Every
  block adds the same squares in the same order, so every block's rows get
  the same factor.
- ``residual``: y = x W^T + residual, the product rounded before the add, as
  the separate add rounds it.
- ``swiglu``: the weight is gate and up stacked ([2 H, K]); a block's first
  half of column tiles are gate rows, its second half the same up rows, and
  it writes silu(gate) * up ([.., H]), each step rounded as mlx-lm's swiglu
  rounds it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from dataclasses import dataclass, replace

import mlx.core as mx

from . import tensor_maps
from .cuda import HEADER, float_bits, hopper, make_kernel
from .fused import compact_source

log = logging.getLogger(__name__)

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

// Two 16-bit elements times two, rounded once (the exact product's rounding, as float32 math then a cast).
template <typename T> __device__ __forceinline__ uint32_t times(uint32_t x, uint32_t y);
template <> __device__ __forceinline__ uint32_t times<__nv_bfloat16>(uint32_t x, uint32_t y) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&x), *reinterpret_cast<__nv_bfloat162*>(&y));
  return *reinterpret_cast<uint32_t*>(&r);
}
template <> __device__ __forceinline__ uint32_t times<__half>(uint32_t x, uint32_t y) {
  __half2 r = __hmul2(*reinterpret_cast<__half2*>(&x), *reinterpret_cast<__half2*>(&y));
  return *reinterpret_cast<uint32_t*>(&r);
}

// A piece of x (8 elements) scaled by the norm's weight.
template <typename T>
__device__ __forceinline__ uint4 scaled(uint4 x, uint4 weight) {
  return make_uint4(times<T>(x.x, weight.x), times<T>(x.y, weight.y), times<T>(x.z, weight.z),
                    times<T>(x.w, weight.w));
}

// silu(gate) * up with each op's result rounded to T (mlx-lm's swiglu, traced: sigmoid, x * sigmoid, * up).
template <typename T>
__device__ __forceinline__ T swiglu(float gate_sum, float up_sum) {
  const float gate = static_cast<float>(static_cast<T>(gate_sum)), up = static_cast<float>(static_cast<T>(up_sum));
  const float sigmoid = static_cast<float>(static_cast<T>(1.f / (1.f + __expf(-gate))));
  return static_cast<T>(static_cast<float>(static_cast<T>(gate * sigmoid)) * up);
}

// A tile's end, in the warps that hold its sums (all of skinny_matmul's block, producer_matmul's consumers,
// whose barrier ``sync`` is): each warp's float32 sums (NORM: and its rows' squares) meet in shared memory,
// are added in warp order (the same order every run), the rows' 1/rms applied, and the epilogue writes y.
template <typename T, int M_TILES, int N_TILES, int WARPS, bool NORM, bool ADD, bool SWIGLU, int EPS_BITS,
          typename Sync>
__device__ __forceinline__ void finish_tile(const float (&acc)[M_TILES][N_TILES][4],
                                            const float (&gram)[M_TILES][2][4], float* sums, float* row_squares,
                                            float* row_scale, Sync sync, const T* residual, T* y, int M,
                                            int n_out, int n0, int K) {
  constexpr int ROWS = M_TILES * 16, R = M_TILES * N_TILES * 4;
  constexpr int OUT_TILES = SWIGLU ? N_TILES / 2 : N_TILES;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  sync();   // the last tile's sums are read
  #pragma unroll
  for (int i = 0; i < M_TILES; ++i)
    #pragma unroll
    for (int j = 0; j < N_TILES; ++j)
      #pragma unroll
      for (int q = 0; q < 4; ++q) sums[(warp * R + (i * N_TILES + j) * 4 + q) * 32 + lane] = acc[i][j][q];
  if constexpr (NORM) {
    // Row g's diagonal entry is column g of gram[i][0]'s top half, row g + 8's column g of gram[i][1]'s
    // bottom half: lane t = g / 2 holds both (accumulator g % 2, 2 + g % 2).
    if (t == g / 2) {
      #pragma unroll
      for (int i = 0; i < M_TILES; ++i) {
        row_squares[warp * ROWS + i * 16 + g] = gram[i][0][g % 2];
        row_squares[warp * ROWS + i * 16 + 8 + g] = gram[i][1][2 + g % 2];
      }
    }
    sync();
    for (int r = threadIdx.x; r < ROWS; r += WARPS * 32) {
      float total = 0.f;
      #pragma unroll
      for (int v = 0; v < WARPS; ++v) total += row_squares[v * ROWS + r];
      row_scale[r] = rsqrtf(total / K + __int_as_float(EPS_BITS));
    }
  }
  sync();
  // Element e: accumulator pair (q, q + 1) of lane e % 32 in output tile j, two neighbouring columns of one
  // row (with SWIGLU, the gate's; the up's are OUT_TILES tiles on).
  for (int e = threadIdx.x; e < M_TILES * OUT_TILES * 2 * 32; e += WARPS * 32) {
    const int r = e / 32 * 2, l = e % 32, q = r % 4, j = (r / 4) % OUT_TILES, i = r / (4 * OUT_TILES);
    const int a = (i * N_TILES + j) * 4 + q, up = a + OUT_TILES * 4;
    float lo = 0.f, hi = 0.f, up_lo = 0.f, up_hi = 0.f;
    #pragma unroll
    for (int v = 0; v < WARPS; ++v) {
      lo += sums[(v * R + a) * 32 + l];
      hi += sums[(v * R + a + 1) * 32 + l];
      if constexpr (SWIGLU) {
        up_lo += sums[(v * R + up) * 32 + l];
        up_hi += sums[(v * R + up + 1) * 32 + l];
      }
    }
    const int row = i * 16 + l / 4 + (q ? 8 : 0), col = n0 + j * 8 + (l % 4) * 2;
    if (row < M && col < n_out) {
      if constexpr (NORM) {
        const float scale = row_scale[row];
        lo *= scale; hi *= scale; up_lo *= scale; up_hi *= scale;
      }
      const size_t at = size_t(row) * n_out + col;
      if constexpr (SWIGLU) {
        y[at] = swiglu<T>(lo, up_lo);
        y[at + 1] = swiglu<T>(hi, up_hi);
      } else if constexpr (ADD) {
        y[at] = static_cast<T>(static_cast<float>(static_cast<T>(lo)) + static_cast<float>(residual[at]));
        y[at + 1] = static_cast<T>(static_cast<float>(static_cast<T>(hi)) + static_cast<float>(residual[at + 1]));
      } else {
        y[at] = static_cast<T>(lo);
        y[at + 1] = static_cast<T>(hi);
      }
    }
  }
}

template <typename T, int M_TILES, int N_TILES, int WARPS, int STAGES, bool NORM, bool ADD, bool SWIGLU,
          int EPS_BITS, bool LOOP, typename S>
__device__ __forceinline__ void skinny_matmul(const T* x, const S& x_shape, int x_ndim, const T* w,
                                              const T* norm_weight, const T* residual, T* y, int N, int K) {
  static_assert(STAGES >= 2, "a ring of one chunk cannot load ahead");
  static_assert(!SWIGLU || N_TILES % 2 == 0, "gate and up take half a block's column tiles each");
  static_assert(!(SWIGLU && ADD), "one epilogue");
  // 16-byte pieces a lane stages a chunk: two a row (and two of the norm's weight).
  constexpr int PIECES = 2 * (N_TILES + 2 * M_TILES + (NORM ? 1 : 0));
  constexpr int R = M_TILES * N_TILES * 4;        // a lane's accumulators
  constexpr int OUT_TILES = SWIGLU ? N_TILES / 2 : N_TILES;   // a block's 8-column tiles of y
  constexpr int ROWS = M_TILES * 16;
  extern __shared__ __align__(16) unsigned char mlxcel_shared[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int n_out = SWIGLU ? N / 2 : N;
  int M = 1;   // x's leading axes are its rows
  for (int d = 0; d < x_ndim - 1; ++d) M *= x_shape[d];
  // LOOP: the block takes column tiles blockIdx.x, + gridDim.x, ..., its warps' rings running on from one
  // tile's chunks into the next's, so the next tile's loads are in flight while a tile's sums are added.
  const int tiles = (n_out + OUT_TILES * 8 - 1) / (OUT_TILES * 8);
  const int my_tiles = LOOP ? (tiles - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x) : 1;
  auto first_column = [&](int tile_step) { return (int(blockIdx.x) + tile_step * int(gridDim.x)) * OUT_TILES * 8; };

  // This warp's chunks of K: every WARPS-th from its index.
  const int mine = max(0, (K / 64 - warp + WARPS - 1) / WARPS);

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

  // A warp's ring of STAGES chunks, [stage][piece][lane]: a lane reads back only what it copied. Chunks are
  // staged in order (tile by tile, each tile's chunks of K): the next to stage is (staged_tile, staged_chunk).
  uint4* ring = reinterpret_cast<uint4*>(mlxcel_shared) + warp * STAGES * PIECES * 32 + lane;
  int staged = 0, staged_tile = 0, staged_chunk = 0;
  const T* w_row[N_TILES];
  auto point_rows = [&](int tile_step) {
    const int n0 = first_column(tile_step);
    #pragma unroll
    for (int j = 0; j < N_TILES; ++j) {
      const int column = min(n0 + (j % OUT_TILES) * 8 + g, n_out - 1) + (j >= OUT_TILES ? n_out : 0);
      w_row[j] = w + size_t(column) * K + t * 8;
    }
  };
  point_rows(0);
  auto stage_chunk = [&]() {
    const bool live = staged_tile < my_tiles && mine > 0;
    const int k = live ? (warp + staged_chunk * WARPS) * 64 : 0;
    uint4* slot = ring + (staged % STAGES) * PIECES * 32;
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
      if constexpr (NORM) copy16(slot + (2 * N_TILES + 4 * M_TILES + half) * 32, norm_weight + k + half * 32 + t * 8,
                                 live);
    }
    asm volatile("cp.async.commit_group;\n" ::);
    ++staged;
    if (live && ++staged_chunk == mine) {
      staged_chunk = 0;
      if (++staged_tile < my_tiles) point_rows(staged_tile);
    }
  };

  float acc[M_TILES][N_TILES][4];
  // NORM: the rows' sums of squares on the tensor cores, X X^T of each 16-row tile against its rows 0..7 and
  // 8..15 (x's pieces are the B operand as they are the A): the diagonal is the squares, exact products
  // summed in float32.
  float gram[M_TILES][2][4];
  auto clear = [&]() {
    #pragma unroll
    for (int i = 0; i < M_TILES; ++i) {
      #pragma unroll
      for (int j = 0; j < N_TILES; ++j)
        #pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;
      #pragma unroll
      for (int h = 0; h < 2; ++h)
        #pragma unroll
        for (int q = 0; q < 4; ++q) gram[i][h][q] = 0.f;
    }
  };

  // The warps' sums of one tile: after the rings (one tile a block: the rings' memory, done with) or beside
  // them (LOOP: the rings hold the next tile's chunks meanwhile).
  constexpr int RING_BYTES = WARPS * STAGES * PIECES * 32 * 16;
  float* sums = reinterpret_cast<float*>(mlxcel_shared + (LOOP ? RING_BYTES : 0));   // [WARPS][R][32]
  float* row_squares = sums + WARPS * R * 32;              // [WARPS][ROWS] (NORM)
  float* row_scale = row_squares + WARPS * ROWS;           // [ROWS]: 1 / rms (NORM)
  auto finish = [&](int n0) {
    if constexpr (!LOOP) wait_copies<0>();   // the rings' memory, done with, holds the sums
    finish_tile<T, M_TILES, N_TILES, WARPS, NORM, ADD, SWIGLU, EPS_BITS>(
        acc, gram, sums, row_squares, row_scale, [] { __syncthreads(); }, residual, y, M, n_out, n0, K);
  };

  #pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) stage_chunk();
  int used = 0;
  for (int tile_step = 0; tile_step < my_tiles; ++tile_step) {
    clear();
    for (int c = 0; c < mine; ++c, ++used) {
      wait_copies<STAGES - 2>();       // chunk `used` has landed
      stage_chunk();                   // into the stage the chunk before it left (its products are issued)
      const uint4* slot = ring + (used % STAGES) * PIECES * 32;
      #pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint4 wv[N_TILES], xv[M_TILES][2];
        #pragma unroll
        for (int j = 0; j < N_TILES; ++j) wv[j] = slot[(half * N_TILES + j) * 32];
        #pragma unroll
        for (int i = 0; i < M_TILES; ++i)
          #pragma unroll
          for (int h = 0; h < 2; ++h) xv[i][h] = slot[(2 * N_TILES + (half * M_TILES + i) * 2 + h) * 32];
        if constexpr (NORM) {
          const uint4 gv = slot[(2 * N_TILES + 4 * M_TILES + half) * 32];
          #pragma unroll
          for (int i = 0; i < M_TILES; ++i) {
            const uint32_t a0[4] = {xv[i][0].x, xv[i][1].x, xv[i][0].y, xv[i][1].y};
            const uint32_t a1[4] = {xv[i][0].z, xv[i][1].z, xv[i][0].w, xv[i][1].w};
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
              mlxcel::Mma<T>::run(gram[i][h], a0, xv[i][h].x, xv[i][h].y);
              mlxcel::Mma<T>::run(gram[i][h], a1, xv[i][h].z, xv[i][h].w);
            }
            #pragma unroll
            for (int h = 0; h < 2; ++h) xv[i][h] = scaled<T>(xv[i][h], gv);
          }
        }
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
    finish(first_column(tile_step));
  }
}

// mbarrier (sm_90): a phase completes when its count of arrivals is in and (bulk copies) its expected bytes
// have landed; waiters name a phase by its parity.
__device__ __forceinline__ void barrier_init(uint64_t* barrier, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(mlxcel::shared_address(barrier)), "r"(count));
}

__device__ __forceinline__ void barrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(mlxcel::shared_address(barrier)) : "memory");
}

// An arrival that also tells the barrier how many bytes of bulk copies its phase waits for.
__device__ __forceinline__ void barrier_arrive_expecting(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(mlxcel::shared_address(barrier)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void barrier_wait(uint64_t* barrier, int parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(mlxcel::shared_address(barrier)), "r"(parity) : "memory");
  }
}

// An arrival made once every cp.async this thread has issued has landed (counted in the barrier's count).
__device__ __forceinline__ void barrier_arrive_on_copies(uint64_t* barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(mlxcel::shared_address(barrier))
               : "memory");
}

// A box of a 2-D tensor map ({k, row} its first element) global -> shared by the SM's copy engine (TMA), its
// bytes counted against the barrier's expected bytes.
__device__ __forceinline__ void tensor_copy(uint32_t shared, const void* map, int k, int row, uint64_t* barrier) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
               :: "r"(shared), "l"(map), "r"(k), "r"(row), "r"(mlxcel::shared_address(barrier)) : "memory");
}

// Piece p (16 bytes) of a stage's 128-byte row r, XOR-swizzled as TMA's 128-byte swizzle writes a box: the
// eight rows an ldmatrix reads at one logical piece lie in eight distinct bank groups.
__device__ __forceinline__ int swizzled(int row, int piece) {
  return row * 128 + ((piece ^ (row % 8)) << 4);
}

// The weight's tensor map (tensor_maps.py's, 128 bytes) at the first 64-byte boundary of its input.
__device__ __forceinline__ const void* aligned_map(const uint8_t* w_map) {
  return reinterpret_cast<const void*>((reinterpret_cast<uintptr_t>(w_map) + 63) & ~uintptr_t(63));
}

// Warp-specialized: one producer warp (the last) only copies, WARPS consumer warps only compute. A block owns
// N_TILES 8-row tiles of the weight (SWIGLU: gate's, then the same up rows) and every gridDim.x-th such tile
// from its index. Its shared ring holds STAGES chunks of 64 k: the block's weight rows, one TMA box (two with
// SWIGLU) through the weight's tensor map, swizzled by the copy engine; x's rows and (NORM) the norm's weight,
// cp.async by the producer's lanes into the same swizzle. Stage s is handed over by two mbarriers: full[s]
// completes a phase when the producer's lane 0 (with the box's bytes) and its 32 lanes' copies are in,
// empty[s] when the consumer that read it is done. Consumer w takes a tile's chunks w, w + WARPS, ... over
// all the block's columns, as skinny_matmul's warps take theirs, and their float32 sums meet in shared memory
// at a tile's end, added in warp order, while the producer streams the next tile's chunks.
//
// Phases: the i-th chunk a block stages goes into stage i % STAGES as that stage's fill f = i / STAGES;
// full[s] completes its phase f when fill f has landed, empty[s] its phase f when fill f is read.
// try_wait.parity(f & 1) returns where the barrier's current phase has the other parity, so a waiter must
// know the barrier is at phase f or f + 1: a consumer waiting for fill f has read fill f - 1 or another warp
// has (it released the stage before fill f was staged), and full[s] cannot complete phase f + 1 before fill
// f is released; the producer waits for empty[s]'s phase f - 1 before fill f (fill 0 waits for nothing).
template <typename T, int M_TILES, int N_TILES, int WARPS, int STAGES, bool NORM, bool ADD, bool SWIGLU,
          int EPS_BITS, typename S>
__device__ __forceinline__ void producer_matmul(const T* x, const S& x_shape, int x_ndim, const T* w,
                                                const uint8_t* w_map, const T* norm_weight, const T* residual,
                                                T* y, int N, int K) {
  static_assert(!SWIGLU || N_TILES % 2 == 0, "gate and up take half a block's column tiles each");
  static_assert(!(SWIGLU && ADD), "one epilogue");
  static_assert(STAGES % WARPS == 0, "a stage read by one consumer warp only");
  static_assert(N_TILES % 2 == 0, "two boxes a stage, half the block's rows each");
  constexpr int ROWS = M_TILES * 16, W_ROWS = N_TILES * 8;
  constexpr int R = M_TILES * N_TILES * 4;                   // a lane's accumulators
  constexpr int OUT_TILES = SWIGLU ? N_TILES / 2 : N_TILES;  // a block's 8-column tiles of y
  constexpr int X_AT = W_ROWS * 128, NORM_AT = X_AT + ROWS * 128;
  constexpr int STAGE_BYTES = (NORM_AT + (NORM ? 128 : 0) + 1023) / 1024 * 1024;   // boxes 1024-byte aligned
  extern __shared__ __align__(16) unsigned char mlxcel_shared[];
  const uint32_t base = mlxcel::shared_address(mlxcel_shared);
  unsigned char* ring = mlxcel_shared + (((base + 1023) & ~1023u) - base);
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + STAGES * STAGE_BYTES);
  uint64_t* empty = full + STAGES;
  float* sums = reinterpret_cast<float*>(empty + STAGES);   // [WARPS][R][32]
  float* row_squares = sums + WARPS * R * 32;               // [WARPS][ROWS] (NORM)
  float* row_scale = row_squares + WARPS * ROWS;            // [ROWS]: 1 / rms (NORM)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n_out = SWIGLU ? N / 2 : N;
  int M = 1;   // x's leading axes are its rows
  for (int d = 0; d < x_ndim - 1; ++d) M *= x_shape[d];
  // A tile's chunks of 64 k, padded to whole rounds of the consumers (a padding chunk is handed over empty):
  // chunk c of every tile is consumer c % WARPS's, and with STAGES a multiple of WARPS a stage is always one
  // consumer's, so a consumer has waited for a stage's previous fill and the parity names the fill it waits for.
  const int chunks = K / 64, rounds = (chunks + WARPS - 1) / WARPS * WARPS;
  const int tiles = (n_out + OUT_TILES * 8 - 1) / (OUT_TILES * 8);
  const int my_tiles = (tiles - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  auto first_column = [&](int tile_step) { return (int(blockIdx.x) + tile_step * int(gridDim.x)) * OUT_TILES * 8; };

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      barrier_init(full + s, 33);   // lane 0's arrival with the boxes' bytes, and each lane's copies
      barrier_init(empty + s, 1);   // the consumer that read it
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   // seen by the copy engine too
  }
  __syncthreads();   // the barriers initialized before any thread uses them; the only block-wide barrier

  if (warp == WARPS) {
    const void* map = aligned_map(w_map);
    const uint32_t ring_at = mlxcel::shared_address(ring);
    int staged = 0;
    for (int tile_step = 0; tile_step < my_tiles; ++tile_step) {
      const int n0 = first_column(tile_step);
      for (int c = 0; c < rounds; ++c, ++staged) {
        const int s = staged % STAGES, fill = staged / STAGES, k0 = c * 64;
        if (fill > 0) barrier_wait(empty + s, (fill - 1) & 1);
        if (c >= chunks) {   // padding: the 33 arrivals, nothing copied
          if (lane == 0) barrier_arrive(full + s);
          barrier_arrive_on_copies(full + s);
          continue;
        }
        const uint32_t stage = ring_at + s * STAGE_BYTES;
        if (lane == 0) {
          // Two boxes of W_ROWS / 2 rows (the map's): gate's and up's with SWIGLU, else the block's halves.
          barrier_arrive_expecting(full + s, W_ROWS * 128);
          tensor_copy(stage, map, k0, n0, full + s);
          tensor_copy(stage + W_ROWS / 2 * 128, map, k0, SWIGLU ? n_out + n0 : n0 + W_ROWS / 2, full + s);
        }
        unsigned char* stage_bytes = ring + s * STAGE_BYTES;
        #pragma unroll
        for (int q = lane; q < ROWS * 8; q += 32) {
          const int row = q / 8, piece = q % 8;
          copy16(stage_bytes + X_AT + swizzled(row, piece), x + size_t(min(row, M - 1)) * K + k0 + piece * 8,
                 row < M);
        }
        if constexpr (NORM) {
          if (lane < 8) copy16(stage_bytes + NORM_AT + lane * 16, norm_weight + k0 + lane * 8, true);
        }
        barrier_arrive_on_copies(full + s);
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");   // nothing in flight when the warp exits
    return;
  }

  const int g = lane / 4, t = lane % 4;
  const int matrix = lane / 8, matrix_row = lane % 8;   // ldmatrix: lane l gives row l % 8 of matrix l / 8
  auto sync_consumers = [] { asm volatile("bar.sync 1, %0;\n" :: "n"(WARPS * 32) : "memory"); };
  float acc[M_TILES][N_TILES][4], gram[M_TILES][2][4];
  for (int tile_step = 0; tile_step < my_tiles; ++tile_step) {
    #pragma unroll
    for (int i = 0; i < M_TILES; ++i) {
      #pragma unroll
      for (int j = 0; j < N_TILES; ++j)
        #pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;
      #pragma unroll
      for (int h = 0; h < 2; ++h)
        #pragma unroll
        for (int q = 0; q < 4; ++q) gram[i][h][q] = 0.f;
    }
    for (int c = warp; c < rounds; c += WARPS) {
      const int used = tile_step * rounds + c, s = used % STAGES;
      barrier_wait(full + s, (used / STAGES) & 1);
      if (c >= chunks) {   // padding
        __syncwarp();
        if (lane == 0) barrier_arrive(empty + s);
        continue;
      }
      const unsigned char* stage = ring + s * STAGE_BYTES;
      #pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        // A weight tile's four matrices: its rows at k pieces 4 pair .. 4 pair + 3, the B operands of k16
        // steps 2 pair and 2 pair + 1.
        uint32_t b[N_TILES][4];
        #pragma unroll
        for (int j = 0; j < N_TILES; ++j)
          mlxcel::load_matrices(b[j], stage + swizzled(j * 8 + matrix_row, 4 * pair + matrix));
        #pragma unroll
        for (int step = 0; step < 2; ++step) {
          // An x tile's A operand: rows +0 / +8 (matrix % 2) at the step's pieces 0 / 1 (matrix / 2).
          uint32_t a[M_TILES][4];
          #pragma unroll
          for (int i = 0; i < M_TILES; ++i)
            mlxcel::load_matrices(a[i], stage + X_AT + swizzled(i * 16 + (matrix % 2) * 8 + matrix_row,
                                                                4 * pair + 2 * step + matrix / 2));
          if constexpr (NORM) {
            // x's rows 0..7 of the tile are the B operand (a[0], a[2]) of the top half's squares, rows 8..15
            // (a[1], a[3]) of the bottom's.
            #pragma unroll
            for (int i = 0; i < M_TILES; ++i) {
              mlxcel::Mma<T>::run(gram[i][0], a[i], a[i][0], a[i][2]);
              mlxcel::Mma<T>::run(gram[i][1], a[i], a[i][1], a[i][3]);
            }
            // Lane (g, t) holds k 2t, 2t + 1 (a[0], a[1]) and 2t + 8, 2t + 9 (a[2], a[3]) of the step.
            const uint32_t* weight = reinterpret_cast<const uint32_t*>(stage + NORM_AT) + (2 * pair + step) * 8 + t;
            const uint32_t low = weight[0], high = weight[4];
            #pragma unroll
            for (int i = 0; i < M_TILES; ++i) {
              a[i][0] = times<T>(a[i][0], low);
              a[i][1] = times<T>(a[i][1], low);
              a[i][2] = times<T>(a[i][2], high);
              a[i][3] = times<T>(a[i][3], high);
            }
          }
          #pragma unroll
          for (int i = 0; i < M_TILES; ++i)
            #pragma unroll
            for (int j = 0; j < N_TILES; ++j)
              mlxcel::Mma<T>::run(acc[i][j], a[i], b[j][2 * step], b[j][2 * step + 1]);
        }
      }
      // After the products that take the stage's operands are issued, so every lane's reads are done.
      __syncwarp();
      if (lane == 0) barrier_arrive(empty + s);
    }

    finish_tile<T, M_TILES, N_TILES, WARPS, NORM, ADD, SWIGLU, EPS_BITS>(
        acc, gram, sums, row_squares, row_scale, sync_consumers, residual, y, M, n_out, first_column(tile_step), K);
  }
}

}  // namespace mlxcel_matmul
"""

SHARED_LIMIT = 227 << 10     # an H100's / H200's shared memory a block may opt into


@dataclass(frozen=True)
class Epilogue:
    """What the launch does besides the product (the module's docstring): the norm of x on the way in (its
    weight an input), the residual added to y (an input), or gate and up folded by swiglu."""

    norm: bool = False
    add: bool = False
    swiglu: bool = False

    def inputs(self, producer: bool = False) -> list[str]:
        return ["x", "w"] + ["w_map"] * producer + ["norm_weight"] * self.norm + ["residual"] * self.add

    def call(self, producer: bool = False) -> str:
        """The kernel body's call: skinny_matmul, or producer_matmul (``Tiles.producer``)."""
        norm = "norm_weight" if self.norm else "(const T*)nullptr"
        residual = "residual" if self.add else "(const T*)nullptr"
        flags = f"{str(self.norm).lower()}, {str(self.add).lower()}, {str(self.swiglu).lower()}, EPS_BITS"
        kernel = (f"producer_matmul<T, M_TILES, N_TILES, WARPS, STAGES, {flags}>" if producer
                  else f"skinny_matmul<T, M_TILES, N_TILES, WARPS, STAGES, {flags}, LOOP>")
        weight = "w, w_map" if producer else "w"
        return f"mlxcel_matmul::{kernel}(x, x_shape, x_ndim, {weight}, {norm}, {residual}, y, w_shape[0], w_shape[1]);"


PRODUCT = Epilogue()


SMS = 132   # an H200's multiprocessors: a block holds one, its shared memory being most of one's
# Whether tiles_for gives every launch to producer_matmul (producer_tiles): off, a sweep's switch.
PRODUCER = False


@dataclass(frozen=True)
class Tiles:
    """A launch's shape: rows in 16-row tiles, a block's columns in 8-column tiles, the block's warps
    splitting K, each with a ring of ``stages`` chunks in flight. ``loop``: a block takes every SMS-th
    column tile or so (one wave of blocks), its rings running on across tiles, where one tile a block
    would take several waves, each block starting with empty rings and ending with none in flight.

    ``producer``: producer_matmul's launch instead (the library's comment on it): ``warps`` consumer warps
    beside the producer warp splitting each chunk's k, one ring of ``stages`` chunks a block, always looping
    (one block an SM)."""

    m_tiles: int
    n_tiles: int = 8
    warps: int = 4
    stages: int = 3
    loop: bool = False
    producer: bool = False

    def shared_bytes(self, epilogue: Epilogue = PRODUCT) -> int:
        rows = self.m_tiles * 16
        sums = 4 * (self.warps * self.m_tiles * self.n_tiles * 4 * 32 + (self.warps + 1) * rows * epilogue.norm)
        if self.producer:
            # Each stage 1024-byte aligned (TMA's swizzled boxes), the ring too (1 KB of slack), two mbarriers.
            stage = -(-((8 * self.n_tiles + rows) * 128 + 128 * epilogue.norm) // 1024) * 1024
            return 1024 + self.stages * (stage + 16) + sums
        ring = self.warps * self.stages * 2 * (self.n_tiles + 2 * self.m_tiles + epilogue.norm) * 32 * 16
        return ring + sums if self.loop else max(ring, sums)

    def threads(self) -> int:
        return (self.warps + self.producer) * 32

    def column_tiles(self, n: int) -> int:
        """A block's worth of columns over a weight of ``n`` rows (swiglu: gate and up, half of each)."""
        return -(-n // (8 * self.n_tiles))

    def blocks(self, n: int) -> int:
        tiles = self.column_tiles(n)
        return -(-tiles // -(-tiles // SMS)) if self.loop else tiles


def tiles_for(rows: int, n: int, epilogue: Epilogue = PRODUCT) -> Tiles:
    """The launch for ``rows`` x ``n``: the widest block of 64, 48 or 32 columns whose blocks fill the most
    of the SMs' waves (a block takes an SM's shared memory: an SM left out of the last wave idles), 4 warps,
    or 8 at 32 columns; each warp a ring of 3 chunks. At 32 rows the 64- and 32-column shapes are the
    sweep's best for gate/up, o and down (gpu_matmul_bench.py --sweep on an H200), and q/k/v's 96 blocks
    of 64 columns left 36 SMs idle. Where the rows' pieces would overfill the shared memory, fewer warps
    first (each keeps its chunks in flight), then fewer stages. The norm's operands and squares take
    registers: past 32 rows it gets 32 columns (else it spills). With ``PRODUCER`` on, producer_tiles'."""
    if PRODUCER:
        return producer_tiles(rows, n, epilogue)

    def filled(n_tiles: int) -> float:
        blocks = -(-n // (8 * n_tiles))
        return blocks / (-(-blocks // SMS) * SMS)

    n_tiles = max((8, 6, 4), key=lambda tiles: (round(filled(tiles), 2), tiles))
    tiles = Tiles(-(-rows // 16), n_tiles=n_tiles, warps=8 if n_tiles == 4 else 4)
    if epilogue.norm and tiles.m_tiles * tiles.n_tiles > 16:
        tiles = replace(tiles, n_tiles=4)
    while tiles.shared_bytes(epilogue) > SHARED_LIMIT:
        tiles = replace(tiles, warps=tiles.warps // 2) if tiles.warps > 4 else replace(tiles, stages=tiles.stages - 1)
    looping = replace(tiles, loop=True)
    if tiles.column_tiles(n) > SMS and looping.shared_bytes(epilogue) <= SHARED_LIMIT:
        return looping
    return tiles


def producer_tiles(rows: int, n: int, epilogue: Epilogue = PRODUCT) -> Tiles:
    """producer_matmul's launch for ``rows`` x ``n``: blocks of 64 columns (the tensor map's boxes are half a
    block's rows: ``weight_map``), 32 past 32 rows (the accumulators' registers), 4 consumer warps, one
    looping block an SM with the deepest ring of up to 16 chunks that fits its shared memory and is a whole
    number of rounds of the consumers. An SM's share of the memory's rate times its latency is ~30 KB (3.8 TB/s
    over 132 SMs, ~1 us): 15 chunks of 64 weight rows hold 120 KB in flight."""
    m_tiles = -(-rows // 16)
    tiles = Tiles(m_tiles, 8 if m_tiles <= 2 else 4, 4, 16, loop=True, producer=True)
    while tiles.stages > tiles.warps and tiles.shared_bytes(epilogue) > SHARED_LIMIT:
        tiles = replace(tiles, stages=tiles.stages - tiles.warps)   # a stage read by one consumer only
    return tiles


@functools.lru_cache(maxsize=None)
def kernel_for(epilogue: Epilogue, shared_bytes: int, producer: bool = False):
    # The digest names the kernel: MLX caches compiled kernels by name (the template's constants apart).
    call = epilogue.call(producer)
    digest = hashlib.sha1((LIBRARY + call).encode()).hexdigest()[:12]
    return make_kernel(f"mlxcel_skinny_matmul_{digest}_{shared_bytes}", epilogue.inputs(producer), ["y"], call,
                       compact_source(LIBRARY), shared_bytes)


def instance_rows(max_rows: int) -> list[int]:
    """One row count for each kernel instance (16-row tiles, ``tiles_for``) of up to ``max_rows`` rows."""
    tiles = -(-min(max_rows, MAX_ROWS) // 16)
    return [16 * m for m in range(1, tiles + 1)]


def takes(x: mx.array, weight: mx.array) -> bool:
    """Whether ``skinny_matmul`` computes x @ weight.T: a 16-bit weight [N, K]
    of x's dtype, N in whole 8-column tiles, K in whole chunks, 1 to MAX_ROWS rows of x."""
    n, k = weight.shape if weight.ndim == 2 else (0, 0)
    return (weight.dtype in DTYPES and x.dtype == weight.dtype and x.shape[-1] == k and k > 0 and k % CHUNK == 0
            and n % 8 == 0 and 0 < x.size // k <= MAX_ROWS)


def takes_norm(x: mx.array, norm_weight: mx.array) -> bool:
    """Whether the launch can normalize x on the way in with this weight (one of x's dtype per channel)."""
    return norm_weight.shape == (x.shape[-1],) and norm_weight.dtype == x.dtype


def takes_tensor_map(weight: mx.array) -> bool:
    """Whether producer_matmul serves this weight's decode products (``weight_map``): one whose 64-column
    tiles are at least two a block (its TMA copies beat the skinny kernel at gate/up's 384 tiles, not at
    q/k/v's 96 or o's and down's 64), on Hopper's CUDA GPU."""
    return (weight.ndim == 2 and weight.dtype in DTYPES and weight.shape[1] % CHUNK == 0
            and weight.shape[0] >= 2 * SMS * 64 and mx.cuda.is_available() and hopper())


# A tensor map's box: half of a producer block's weight rows (gate's or up's with SWIGLU), 4 x its n tiles.
MAP_BOX_ROWS = 32   # producer_tiles' 64-column blocks


def weight_map(weight: mx.array) -> mx.array | None:
    """The weight's tensor map for producer_matmul's blocks of 64 columns (``MAP_BOX_ROWS``); None where the
    driver cannot encode one (its products stay on the skinny kernel)."""
    try:
        return tensor_maps.weight_map(weight, MAP_BOX_ROWS)
    except (OSError, AttributeError) as error:
        log.info("no tensor map for a %s weight (%s): its products stay on the skinny kernel", weight.shape, error)
        return None


def skinny_matmul(x: mx.array, weight: mx.array, tiles: Tiles | None = None, *,
                  norm: tuple[mx.array, float] | None = None, residual: mx.array | None = None,
                  swiglu: bool = False, tensor_map: mx.array | None = None) -> mx.array:
    """x [..., K] @ weight.T for a weight [N, K] that ``takes`` accepts; ``norm`` (weight, eps): of
    rms_norm(x) instead; ``residual`` [..., N]: plus it; ``swiglu`` (N in whole 16-column tiles): swiglu of
    the product's two halves, gate then up ([..., N / 2]). ``tensor_map`` (``weight_map``'s): on
    producer_matmul's launch where rows are 32 or fewer."""
    n, k = weight.shape
    epilogue = Epilogue(norm=norm is not None, add=residual is not None, swiglu=swiglu)
    rows = x.size // k
    if tiles is None:
        mapped = tensor_map is not None and rows <= 32
        tiles = producer_tiles(rows, n, epilogue) if mapped else tiles_for(rows, n, epilogue)
    inputs = [x, weight] + ([norm[0]] if norm else []) + ([residual] if residual is not None else [])
    if tiles.producer:
        box_rows = 4 * tiles.n_tiles
        if tensor_map is None or box_rows != MAP_BOX_ROWS:   # a sweep's or a test's launch shape
            tensor_map = tensor_maps.weight_map(weight, box_rows)
        inputs.insert(2, tensor_map)
    y, = kernel_for(epilogue, tiles.shared_bytes(epilogue), tiles.producer)(
        inputs=inputs,
        # producer_matmul's loop is its grid's, not a constant of its code.
        template=[("T", x.dtype), ("M_TILES", tiles.m_tiles), ("N_TILES", tiles.n_tiles), ("WARPS", tiles.warps),
                  ("STAGES", tiles.stages), ("EPS_BITS", float_bits(norm[1]) if norm else 0)]
                 + [("LOOP", tiles.loop)] * (not tiles.producer),
        grid=(tiles.blocks(n) * tiles.threads(), 1, 1), threadgroup=(tiles.threads(), 1, 1),
        output_shapes=[(*x.shape[:-1], n // 2 if swiglu else n)], output_dtypes=[x.dtype])
    return y
