"""The skinny matmul on Hopper's warpgroup MMA (``wgmma``, sm_90a): y = x W^T for a decode step's few rows.

The mma.sync kernel (cuda_matmul) gives each of a block's warps its own K chunks, and each warp reads every
staged weight and x element back through its registers: with one warp a scheduler, the SM's copies wait on
those reads, and it streams the weight at ~3.2 TB/s where cuBLAS's TMA kernels reach ~3.9. Here a block is
one warpgroup that reads the whole of K for its ``8 N_TILES`` weight rows:

- a chunk of K_BLOCKS x 64 k is the block's weight rows (128 bytes a k block, eight threads a row's whole
  line) in the 128-byte-swizzled K-major layout the MMA reads as its B operand, and x's rows (<= 64) beside
  it, padded rows for conflict-free ldmatrix; cp.async, a ring of STAGES chunks, STAGES - 2 loading while
  one is read and the last one's MMAs still run (each chunk's are waited for only after the next's issue);
- x is the A operand from registers (warp w holds x rows 16w..16w+15, zeros past the staged rows): one
  m64nNk16 a k-step, N = the block's weight rows, so the tensor cores read the weight from shared memory
  themselves;
- no warp splits K, so the sums need no meeting in shared memory: each lane writes its accumulators.

The epilogues are cuda_matmul's: ``norm`` scales each lane's x words by the norm's weight (staged with the
chunk; one rounding) before they become operands, sums their squares in float32 (every block the same
terms in the same order, so every block's rows get the same factor) and multiplies the sums by the row's
1/rms at the end; ``residual`` adds after the product's rounding; ``swiglu`` reads gate rows in the first
half of a block's weight rows and the same up rows in the second, so a lane holds both of an output.
"""

from __future__ import annotations

WARPGROUP_MATMUL = r"""
namespace mlxcel_matmul {

template <typename T, int M_TILES, int N_TILES, int K_BLOCKS, int STAGES, bool NORM, bool ADD, bool SWIGLU,
          int EPS_BITS, typename S>
__device__ __forceinline__ void warpgroup_matmul(const T* x, const S& x_shape, int x_ndim, const T* w,
                                                 const T* norm_weight, const T* residual, T* y, int N, int K) {
  static_assert(STAGES >= 3, "one chunk read, one under the MMAs, one loading at least");
  static_assert(N_TILES % 2 == 0 && M_TILES >= 1 && M_TILES <= 4, "16-row pieces of the weight, <= 64 x rows");
  static_assert(!(SWIGLU && ADD), "one epilogue");
  constexpr int THREADS = 128;
  constexpr int COLUMNS = N_TILES * 8;              // the block's weight rows: the MMA's N
  constexpr int ROWS = M_TILES * 16;                // x rows staged
  constexpr int STEPS = K_BLOCKS * 4;               // k-steps of 16 a chunk (K_BLOCKS blocks of 64)
  constexpr int X_STRIDE = K_BLOCKS * 128 + 16;     // bytes a staged x row, padded: conflict-free ldmatrix
  constexpr int W_BLOCK = COLUMNS * 128;            // a 64-wide k block of the weight's rows
  constexpr int W_STAGE = K_BLOCKS * W_BLOCK, X_STAGE = ROWS * X_STRIDE, G_STAGE = K_BLOCKS * 128;
  constexpr int W_COPIES = COLUMNS * 8 / THREADS;   // 16-byte pieces a thread copies a k block
  constexpr int OUT_TILES = SWIGLU ? N_TILES / 2 : N_TILES;
  constexpr int OUT_COLUMNS = OUT_TILES * 8;
  extern __shared__ __align__(16) unsigned char mlxcel_shared[];
  // The swizzle's pattern repeats every 1024 bytes: the weight's ring starts on one.
  const uint32_t shared0 = mlxcel::shared_address(mlxcel_shared);
  unsigned char* w_ring = mlxcel_shared + ((1024 - (shared0 & 1023)) & 1023);   // [STAGES][K_BLOCKS][COLUMNS][128 B]
  unsigned char* x_ring = w_ring + STAGES * W_STAGE;                            // [STAGES][ROWS][X_STRIDE]
  unsigned char* g_ring = x_ring + STAGES * X_STAGE;                            // [STAGES][64 K_BLOCKS] (NORM)
  const uint32_t w_ring_at = mlxcel::shared_address(w_ring);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int n_out = SWIGLU ? N / 2 : N;
  const int n0 = blockIdx.x * OUT_COLUMNS;
  int M = 1;   // x's leading axes are its rows
  for (int d = 0; d < x_ndim - 1; ++d) M *= x_shape[d];
  const int chunks = (K / 64 + K_BLOCKS - 1) / K_BLOCKS;

  // A thread copies pieces piece of rows row0, row0 + 16, ...: eight threads read a row's 128 bytes.
  const int piece = threadIdx.x % 8, row0 = threadIdx.x / 8;
  const T* w_from[W_COPIES];
  uint32_t w_to[W_COPIES];
  #pragma unroll
  for (int j = 0; j < W_COPIES; ++j) {
    const int r = row0 + 16 * j;
    const int column = min(n0 + r % OUT_COLUMNS, n_out - 1) + (r >= OUT_COLUMNS ? n_out : 0);
    w_from[j] = w + size_t(column) * K + piece * 8;
    w_to[j] = r * 128 + ((piece ^ (r & 7)) << 4);
  }
  const T* x_from[M_TILES];
  bool x_live[M_TILES];
  #pragma unroll
  for (int j = 0; j < M_TILES; ++j) {
    const int r = row0 + 16 * j;
    x_live[j] = r < M;
    x_from[j] = x + size_t(min(r, M - 1)) * K + piece * 8;
  }
  // Chunk `chunk` into stage `buffer`; past K (a last chunk's blocks, the ring's tail): zeros, nothing read.
  auto stage = [&](int chunk, int buffer) {
    #pragma unroll
    for (int b = 0; b < K_BLOCKS; ++b) {
      const int block = chunk * K_BLOCKS + b;
      const bool live = block < K / 64;
      const int k = live ? block * 64 : 0;
      #pragma unroll
      for (int j = 0; j < W_COPIES; ++j)
        mlxcel::copy_async(w_ring + buffer * W_STAGE + b * W_BLOCK + w_to[j], w_from[j] + k, live);
      #pragma unroll
      for (int j = 0; j < M_TILES; ++j)
        mlxcel::copy_async(x_ring + buffer * X_STAGE + (row0 + 16 * j) * X_STRIDE + b * 128 + piece * 16,
                           x_from[j] + k, live && x_live[j]);
      if constexpr (NORM) {
        if (threadIdx.x < 8)
          mlxcel::copy_async(g_ring + buffer * G_STAGE + b * 128 + piece * 16, norm_weight + k + piece * 8, live);
      }
    }
    mlxcel::copy_commit();
  };

  float acc[COLUMNS / 2];
  #pragma unroll
  for (int i = 0; i < COLUMNS / 2; ++i) acc[i] = 0.f;
  float squares[2] = {0.f, 0.f};                   // NORM: rows g and g + 8 of this warp's, this lane's terms
  const bool x_warp = warp < M_TILES;              // warps past the staged rows give the MMA zeros

  // One chunk: its MMAs are issued and left running while the next chunk is waited for and loaded; the
  // MMAs read their A words from registers as they run, so a chunk's words (`a`) and the last one's
  // (`running`) are two arrays, and the last one's stays live until its MMAs are waited for.
  int buffer = 0, next = STAGES - 2;               // this chunk's stage; the one chunk c - 2 left
  auto run_chunk = [&](int c, uint32_t (&a)[STEPS][4], uint32_t (&running)[STEPS][4]) {
    // This chunk landed (this thread's copies, then everyone's), in view of the MMA; chunk c - 2's
    // stage is free: every thread waited for its MMAs before this barrier.
    mlxcel::copy_wait<STAGES - 3>();
    mlxcel::async_proxy_fence();
    __syncthreads();
    stage(c + STAGES - 2, next);
    // x's words as the A operand, k-step kk: a[kk][0..3] rows g, g + 8 at k 2t, 2t + 1, then k + 8.
    if (x_warp) {
      const unsigned char* rows = x_ring + buffer * X_STAGE + (warp * 16 + lane % 16) * X_STRIDE + (lane / 16) * 16;
      #pragma unroll
      for (int kk = 0; kk < STEPS; ++kk) mlxcel::load_matrices(a[kk], rows + (kk / 4) * 128 + (kk % 4) * 32);
      if constexpr (NORM) {
        const uint32_t* gamma = reinterpret_cast<const uint32_t*>(g_ring + buffer * G_STAGE);
        #pragma unroll
        for (int kk = 0; kk < STEPS; ++kk) {
          #pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 v = mlxcel::load_pair(reinterpret_cast<const T*>(&a[kk][i]));
            squares[i & 1] = fmaf(v.y, v.y, fmaf(v.x, v.x, squares[i & 1]));
            a[kk][i] = times<T>(a[kk][i], gamma[kk * 8 + (i >> 1) * 4 + t]);
          }
        }
      }
    } else {
      #pragma unroll
      for (int kk = 0; kk < STEPS; ++kk) a[kk][0] = a[kk][1] = a[kk][2] = a[kk][3] = 0u;
    }
    mlxcel::mma_fence();
    #pragma unroll
    for (int kk = 0; kk < STEPS; ++kk)
      mlxcel::projection_mma<T, COLUMNS>(
          acc, a[kk], mlxcel::smem_descriptor(w_ring_at + buffer * W_STAGE + (kk / 4) * W_BLOCK + (kk % 4) * 32, 1, 64));
    mlxcel::mma_commit();
    mlxcel::mma_wait<1>();                         // chunk c - 1's MMAs are done
    mlxcel::keep_live(running);
    buffer = buffer + 1 == STAGES ? 0 : buffer + 1;
    next = next + 1 == STAGES ? 0 : next + 1;
  };
  uint32_t even[STEPS][4] = {}, odd[STEPS][4] = {};
  #pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) stage(s, s);
  for (int c = 0; c < chunks; c += 2) {
    run_chunk(c, even, odd);
    if (c + 1 < chunks) run_chunk(c + 1, odd, even);
  }
  mlxcel::mma_wait<0>();
  mlxcel::keep_live(even);
  mlxcel::keep_live(odd);
  mlxcel::mma_settle(acc);
  mlxcel::copy_wait<0>();                          // no copy outlives the block

  float scale[2] = {1.f, 1.f};
  if constexpr (NORM) {
    #pragma unroll
    for (int h = 0; h < 2; ++h)
      scale[h] = rsqrtf(mlxcel::lane_sum(mlxcel::lane_sum(squares[h], 1), 2) / K + __int_as_float(EPS_BITS));
  }
  // Accumulator 4j + 2h + u: x row 16 warp + g + 8h, weight row 8j + 2t + u of the block's.
  #pragma unroll
  for (int j = 0; j < OUT_TILES; ++j) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 16 + g + 8 * h, col = n0 + j * 8 + 2 * t;
      if (row >= M || col >= n_out) continue;
      const float lo = acc[4 * j + 2 * h] * scale[h], hi = acc[4 * j + 2 * h + 1] * scale[h];
      const size_t at = size_t(row) * n_out + col;
      if constexpr (SWIGLU) {
        const int up = 4 * (j + OUT_TILES) + 2 * h;
        y[at] = swiglu<T>(lo, acc[up] * scale[h]);
        y[at + 1] = swiglu<T>(hi, acc[up + 1] * scale[h]);
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

}  // namespace mlxcel_matmul
"""
