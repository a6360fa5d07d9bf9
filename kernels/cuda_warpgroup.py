"""Cascade level 0 on Hopper's warpgroup MMA (``wgmma``, sm_90a): the CUDA
partial kernel's stacked launch, for 16-bit and int8 pages.

A stacked level runs many query heads (M members x G) against one span, so
its product has the shape of a prefill's, where ``mma.sync`` (the partial
kernel's) is bound by shared memory: each 16-head warp reads every staged K
and V element through ldmatrix for 16 rows of work. One warpgroup MMA takes
64 rows, reads its B operand (K, then V) from shared memory itself and runs
asynchronously, as FlashAttention-3 does:

- a block is one or two warpgroups (4 warps, 64 stacked heads each, sharing
  the staged chunks; more heads are more head groups, each a block over the
  same tile, as the partial kernel's layout with head-splitting warps);
- Q is staged once, pre-scaled into the log2 domain, in the 128-byte-swizzled
  K-major layout the MMA reads; K and V chunks of 64 tokens are copied into the
  same layout (cp.async, a ring of STAGES chunks, page lookups a chunk ahead,
  slots checked only in a row's end chunks, as the partial kernel stages);
- S = Q K^T is D/16 m64n64k16 products from shared memory; the online softmax
  runs on its accumulators (each warp's 16 rows in mma.sync's C layout), and
  P becomes the A operand of O += P V (m64nDk16, A from registers, V read
  transposed from its token-major rows);
- states are written as the partial kernel writes them (normalized o, log2
  lse per tile and head), so the merge is unchanged.

int8 pages (the partial kernel's stage of code rows and scales in the ring)
are converted once a chunk, by the whole block, into float16 K and V
operands in the layouts above, for every head group's products: each
dequantized with its token's scale and rounded once (so no scale waits
between S and the softmax). Where the partial kernel converts the staged codes
in every head-splitting warp, once for each 16 heads, this converts them once
for 64 or 128. Blocks of two warpgroups get two more, the producers (as
FlashAttention-3 specializes warps): they stage and convert each chunk into
one of two operand pairs while the two consumers' products and softmaxes
run, and named barriers hand each pair over and back, so the consumers never
wait on a block-wide barrier. A conversion phase's 8 threads store one 16-byte
piece of 8 rows, distinct banks under the swizzle (a phase storing one row's
pieces would hit its two column blocks, 8192 bytes apart: the same banks).

Shared memory layouts (the PTX ISA's canonical GMMA layouts, 128-byte swizzle):
a matrix of rows of D 16-bit elements is stored as D/64 column blocks of
[rows][64 elements], 128 bytes a row, its 16-byte piece c at c ^ (row % 8).
K-major (Q, K): 8-row groups 1024 bytes apart (the descriptor's stride
offset), a k-step of 16 elements 32 bytes on. V as B of P V is MN-major: its
64-dim column blocks are a chunk's 64 rows x 128 bytes apart (leading offset),
8-token groups 1024 bytes apart (stride offset).
"""

from __future__ import annotations

# The MMA wrappers, their 32 or 64 accumulator operands spelled out. Each is
# a template instantiated only where a kernel calls it: the library is
# compiled for every device, and ptxas rejects wgmma below sm_90a.
def _asm(shape: str, ptx: str, count: int, a: str, inputs: str, predicate: int) -> str:
    regs = ", ".join(f"%{i}" for i in range(count))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(count))
    return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{predicate}, 0;\\n"\n'
            f'        "wgmma.mma_async.sync.aligned.{shape}.f32.{ptx}.{ptx} {{{regs}}}, {a}\\n}}\\n"\n'
            f'        : {outs}\n        : {inputs});')


def _scores_mma() -> str:
    """m64n64k16, A and B from shared memory (descriptors): d += A B (d = A B unless accumulate)."""
    body = {ptx: _asm("m64n64k16", ptx, 32, "%32, %33, p, 1, 1, 0, 0;", '"l"(a), "l"(b), "r"(accumulate)', 34)
            for ptx in ("bf16", "f16")}
    return f"""
template <typename T>
__device__ __forceinline__ void scores_mma(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {{
  if constexpr (Mma<T>::BF16) {{
    {body["bf16"]}
  }} else {{
    {body["f16"]}
  }}
}}
"""


def _values_mma() -> str:
    """m64nNk16, A from registers (4 words), B transposed from shared memory: d += A B."""
    branches = []
    for n in (64, 128):
        count = n // 2
        a = f"{{%{count}, %{count + 1}, %{count + 2}, %{count + 3}}}, %{count + 4}, p, 1, 1, 1;"
        inputs = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1)'
        bf16, f16 = (_asm(f"m64n{n}k16", ptx, count, a, inputs, count + 5) for ptx in ("bf16", "f16"))
        branches.append(f"""if constexpr (N == {n}) {{
    if constexpr (Mma<T>::BF16) {{
      {bf16}
    }} else {{
      {f16}
    }}
  }}""")
    return f"""
template <typename T, int N>
__device__ __forceinline__ void values_mma(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {{
  {" else ".join(branches)}
}}
"""


WARPGROUP_HEADER = r"""
namespace mlxcel {

// A shared-memory matrix descriptor: byte address, leading and stride byte
// offsets (16-byte units), 128-byte swizzle.
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t address, uint32_t leading, uint32_t stride) {
  return uint64_t((address & 0x3ffff) >> 4) | uint64_t(leading) << 16 | uint64_t(stride) << 32 | uint64_t(1) << 62;
}

// Registers written by ordinary instructions reach the next warpgroup MMA.
__device__ __forceinline__ void mma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void mma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void mma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// After the wait: the accumulators are read as the MMA left them, never
// from before it (the compiler does not know the MMA runs asynchronously).
template <int N>
__device__ __forceinline__ void mma_settle(float (&d)[N]) {
  #pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
// Named barrier `id` of `count` threads: arrive without waiting, or wait for all.
__device__ __forceinline__ void barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
// Shared memory written by this thread (stores, cp.async) is seen by the MMA's reads.
__device__ __forceinline__ void async_proxy_fence() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The 16-byte piece `piece` of row `row` in a 128-byte-swizzled block of
// [rows][64 elements] column blocks `block_bytes` apart.
__device__ __forceinline__ uint32_t swizzled(int row, int piece, int block_bytes) {
  return (piece >> 3) * block_bytes + row * 128 + (((piece & 7) ^ (row & 7)) << 4);
}

""" + _scores_mma() + _values_mma() + r"""
}  // namespace mlxcel
"""

WARPGROUP_PARTIAL_SOURCE = r"""
  // ---- constants and coordinates (as the partial kernel's) ----
  using Format = mlxcel::PageFormat<T>;
  using TM = typename Format::Operand;              // the MMA's operand type: T, or float16 for int8 codes
  constexpr bool QUANTIZED = Format::QUANTIZED;
  static_assert(CHUNK == 64 && D % 64 == 0 && D <= 128, "m64n64 score tiles over 64-token chunks, D = 64 or 128");
  static_assert(WARPS % 4 == 0, "whole warpgroups");
  static_assert(!Format::AFFINE, "int4 pages stay on the partial kernel");
  constexpr int THREADS = WARPS * 32;
  constexpr int ROWS = WARPS * 16;                 // stacked heads a block owns: 64 (the MMA's M) a warpgroup
  constexpr int NT = CHUNK / 8;                    // score tiles (8 tokens)
  constexpr int DT = D / 8;                        // output tiles (8 dims)
  constexpr int ROW_BYTES = D * Format::BITS / 8;  // a token's K (or V) elements, or codes, in one KV head
  constexpr int VECS = ROW_BYTES / 16;             // 16-byte pieces a token row's pages hold
  constexpr int OPERAND_VECS = D / 8;              // 16-byte pieces a row of 16-bit operands (Q, K, V)
  constexpr int Q_BLOCK = 64 * 128, KV_BLOCK = CHUNK * 128;     // bytes of one 64-element column block
  constexpr int Q_BYTES = 64 * D * 2, KV_BYTES = CHUNK * D * 2;  // a warpgroup's Q; a chunk's K (or V)
  // The ring's chunks: 16-bit K and V in the MMA's layouts, or int8 pages'
  // stage (the partial kernel's: code rows 16 bytes apart, then scales)
  // beside the converted operands: two pairs where a producer converts
  // (below), one in a block of one warpgroup, converted at its chunk's start
  // by the whole block (two would leave its SM one block).
  constexpr int CODE_STRIDE = ROW_BYTES + 16;
  constexpr int STAGE_BYTES = QUANTIZED ? mlxcel::ScaleRows<false, D>::template STAGE<CHUNK, CODE_STRIDE> : 2 * KV_BYTES;
  // int8 blocks of two warpgroups: two more, the producers, stage and
  // convert chunks into two operand pairs while the two consumers' products
  // and softmaxes run (named barriers FULL + pair and EMPTY + pair hand a
  // pair over and back). The launch adds its threads: fused.block_threads.
  constexpr bool PRODUCER = QUANTIZED && WARPS >= 8;
  constexpr int PRODUCER_THREADS = PRODUCER ? 256 : 0;     // two warpgroups: fused.block_threads adds them
  constexpr int COPY_THREADS = PRODUCER ? PRODUCER_THREADS : THREADS;   // the threads that stage and convert
  constexpr int PRODUCER_BARRIER = 1, CONSUMER_BARRIER = 2, FULL = 3, EMPTY = 5;
  constexpr int OPERAND_BYTES = QUANTIZED ? (PRODUCER ? 4 : 2) * KV_BYTES : 0;
  const float scale = __int_as_float(SCALE_BITS);
  const float neg_inf = -mlxcel::infinity();

  const int kv_heads = k_pool_shape[2];
  const int q_heads = q_shape[1];
  const int group_size = q_heads / kv_heads;
  const int heads = STACKED ? members_shape[1] * group_size : group_size;
  const int out_heads = kv_heads * heads;
  const int groups = (heads + ROWS - 1) / ROWS;
  const int tile = blockIdx.x / groups;
  const int group = blockIdx.x % groups;
  const int kv_head = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tig = lane % 4;

  const int* geometry = tiles + 5 * tile;
  const int row = geometry[0], page_begin = geometry[1], page_count = geometry[2];
  const int first_slot = geometry[3];
  const int end_slot = page_count * BLOCK - (geometry[4] ? BLOCK - last_page_len[row] : 0);

  // The swizzle's pattern repeats every 1024 bytes: the layouts start on one.
  extern __shared__ __align__(16) unsigned char mlxcel_shared[];
  const uint32_t shared0 = mlxcel::shared_address(mlxcel_shared);
  unsigned char* base = mlxcel_shared + ((1024 - (shared0 & 1023)) & 1023);
  // Each warpgroup's Q, the converted operands (int8), then the ring the
  // warpgroups share (they read every chunk's K and V).
  const uint32_t q_at = mlxcel::shared_address(base) + (warp / 4) * Q_BYTES;       // [D / 64][64][128 B]
  unsigned char* operands = base + (WARPS / 4) * Q_BYTES;              // [pairs][K, V][D / 64][CHUNK][128 B]
  unsigned char* ring = operands + OPERAND_BYTES;                                   // [STAGES][STAGE_BYTES]

  // ---- 1. Q, scaled, in the swizzled layout (rows past the heads: zeros) ----
  const bool producer = PRODUCER && warp >= WARPS;
  #pragma unroll
  for (int i = 0; i < ROWS * OPERAND_VECS / THREADS; ++i) {
    if (producer) break;
    const int item = i * THREADS + threadIdx.x;
    const int r = item / OPERAND_VECS, piece = item % OPERAND_VECS;
    const int head = group * ROWS + r;
    const int real = min(head, heads - 1);
    const int q_row = STACKED ? members[row * members_shape[1] + real / group_size] : row;
    const int q_head = kv_head * group_size + real % group_size;
    float x[8];
    mlxcel::load_row(q + (size_t(q_row) * q_heads + q_head) * D + piece * 8, x);
    uint32_t w[4];
    #pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = head < heads ? mlxcel::Mma<TM>::pack(x[2 * k] * scale, x[2 * k + 1] * scale) : 0u;
    *reinterpret_cast<uint4*>(base + (r / 64) * Q_BYTES + mlxcel::swizzled(r % 64, piece, Q_BLOCK)) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }

  // ---- 2. staging (the partial kernel's copies, into the swizzled layout) ----
  using Copies = mlxcel::ChunkCopies<VECS, COPY_THREADS, CHUNK, BLOCK>;
  constexpr int LOOKUPS = Copies::LOOKUPS;
  const int copy_thread = PRODUCER ? int(threadIdx.x) - THREADS : int(threadIdx.x);
  const Copies copies(indices, page_begin, page_count, first_slot, end_slot, kv_heads, kv_head, copy_thread);
  auto stage = [&](int chunk, int buffer, const int (&pages)[LOOKUPS]) {
    unsigned char* keys = ring + buffer * STAGE_BYTES;
    copies.stage(chunk, [&](bool at_ends) {
      if constexpr (QUANTIZED) {
        copies.template copy_code_rows<false, ROW_BYTES, CODE_STRIDE>(k_pool, v_pool, k_scales, v_scales, nullptr,
                                                                      nullptr, pages, chunk, at_ends, keys);
      } else {
        copies.copy_rows(k_pool, v_pool, pages, chunk, at_ends, keys, keys + KV_BYTES,
                         [](int row, int piece) { return mlxcel::swizzled(row, piece, KV_BLOCK); });
      }
    });
  };
  // int8: which half of a staged scale word is this KV head's, by the token's parity (the partial kernel's).
  const int even_half = kv_head & 1, odd_half = (kv_heads + kv_head) & 1;

  float acc[DT * 4];
  #pragma unroll
  for (int i = 0; i < DT * 4; ++i) acc[i] = 0.f;
  float row_max[2] = {neg_inf, neg_inf};           // rows g, g + 8 of this warp's 16; log2 domain
  float row_sum[2] = {0.f, 0.f};

  const int chunk_begin = first_slot / CHUNK;
  const int chunk_end = (end_slot + CHUNK - 1) / CHUNK;
  int pages[LOOKUPS];
  if (!PRODUCER || producer) copies.template fill<STAGES>(chunk_begin, chunk_end, pages, stage);
  // ---- 2b. int8: a chunk's codes (ring buffer `from`) into float16
  // operands (pair `pair`) by the threads that stage, 16 codes a piece ----
  auto convert = [&](int from, int pair) {
    const unsigned char* staged = ring + from * STAGE_BYTES;
    const __half* scales = reinterpret_cast<const __half*>(staged + 2 * CHUNK * CODE_STRIDE);
    constexpr int PIECES = CHUNK * VECS;
    static_assert(PIECES % COPY_THREADS == 0, "whole passes over a chunk's pieces");
    #pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      #pragma unroll
      for (int i = 0; i < PIECES / COPY_THREADS; ++i) {
        // A phase's 8 threads: one piece of 8 rows, so their float16 stores land on 8 distinct 16-byte bank
        // groups (the row's swizzle), as their code loads do (rows CODE_STRIDE apart).
        const int item = i * COPY_THREADS + copy_thread;
        const int r = item % 8 + 8 * (item / (8 * VECS)), c = item / 8 % VECS;
        const uint4 w = *reinterpret_cast<const uint4*>(staged + (kv * CHUNK + r) * CODE_STRIDE + c * 16);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
        const __half2 factor = __half2half2(scales[(kv * CHUNK + r) * 2 + ((r & 1) ? odd_half : even_half)]);
        uint32_t h[8];
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t flipped = words[k] ^ 0x80808080u;
          const __half2 lo = mlxcel::int8_pair<0x4140>(flipped), hi = mlxcel::int8_pair<0x4342>(flipped);
          h[2 * k] = mlxcel::as_word(__hmul2(lo, factor));
          h[2 * k + 1] = mlxcel::as_word(__hmul2(hi, factor));
        }
        unsigned char* to = operands + (pair * 2 + kv) * KV_BYTES;
        *reinterpret_cast<uint4*>(to + mlxcel::swizzled(r, 2 * c, KV_BLOCK)) = make_uint4(h[0], h[1], h[2], h[3]);
        *reinterpret_cast<uint4*>(to + mlxcel::swizzled(r, 2 * c + 1, KV_BLOCK)) = make_uint4(h[4], h[5], h[6], h[7]);
      }
    }
    mlxcel::async_proxy_fence();
  };
  // A chunk landed: this thread's copies, then (after the barrier) everyone's.
  auto landed = [&]() {
    mlxcel::copy_wait<STAGES - 2>();
    mlxcel::async_proxy_fence();
    __syncthreads();
  };
  if constexpr (PRODUCER) {
    if (producer) {   // each chunk: landed, the next staged, its pair free again, converted, handed over
      int buffer = 0;
      for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
        const int n = chunk - chunk_begin;
        mlxcel::copy_wait<STAGES - 2>();
        mlxcel::barrier_sync(PRODUCER_BARRIER, PRODUCER_THREADS);
        copies.template refill<STAGES>(chunk, chunk_end, buffer, pages, stage);
        if (n >= 2) mlxcel::barrier_sync(EMPTY + (n & 1), THREADS + PRODUCER_THREADS);
        convert(buffer, n & 1);
        mlxcel::barrier_arrive(FULL + (n & 1), THREADS + PRODUCER_THREADS);
        buffer = buffer + 1 == STAGES ? 0 : buffer + 1;
      }
      return;
    }
    mlxcel::async_proxy_fence();                   // Q in view of the consumers' MMAs
    mlxcel::barrier_sync(CONSUMER_BARRIER, THREADS);
  }
  int buffer = 0;
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    // This chunk landed, in view of the MMA (PRODUCER: converted into its
    // pair). The buffer staged next was read by MMAs waited for last chunk
    // (int8: by its conversion).
    const int n = chunk - chunk_begin;
    const int pair = PRODUCER ? n & 1 : 0;
    if constexpr (PRODUCER) {
      mlxcel::barrier_sync(FULL + pair, THREADS + PRODUCER_THREADS);
    } else {
      landed();
      copies.template refill<STAGES>(chunk, chunk_end, buffer, pages, stage);
      if constexpr (QUANTIZED) {   // the last chunk's MMAs were waited for
        convert(buffer, pair);
        __syncthreads();
      }
    }
    unsigned char* converted = operands + pair * 2 * KV_BYTES;    // int8: this chunk's operands
    const uint32_t keys_at = mlxcel::shared_address(QUANTIZED ? converted : ring + buffer * STAGE_BYTES);
    const uint32_t values_at = keys_at + KV_BYTES;

    // ---- 3a. S = Q K^T: D / 16 k-steps, 32 bytes on within a column block ----
    float s[NT * 4];
    mlxcel::mma_fence();
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t step = (kk % 4) * 32;          // column block kk / 4, k-step kk % 4 in it
      mlxcel::scores_mma<TM>(s, mlxcel::smem_descriptor(q_at + (kk / 4) * Q_BLOCK + step, 1, 64),
                            mlxcel::smem_descriptor(keys_at + (kk / 4) * KV_BLOCK + step, 1, 64), kk > 0);
    }
    mlxcel::mma_commit();
    mlxcel::mma_wait();
    mlxcel::mma_settle(s);

    // ---- 4. mask and online softmax (the partial kernel's, 64 tokens a step) ----
    const int slot0 = chunk * CHUNK;
    if (slot0 < first_slot || slot0 + CHUNK > end_slot) {
      #pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        #pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int slot = slot0 + nt * 8 + tig * 2 + (c & 1);
          if (slot < first_slot || slot >= end_slot) s[nt * 4 + c] = neg_inf;
        }
      }
    }
    float step_max[2] = {neg_inf, neg_inf};
    #pragma unroll
    for (int i = 0; i < NT * 4; ++i) step_max[(i >> 1) & 1] = fmaxf(step_max[(i >> 1) & 1], s[i]);
    // Warp-uniform: the MMA's rows are the warp's, rescaled by its own lanes.
    float alpha[2];
    if (mlxcel::rebase(step_max, row_max, row_sum, alpha)) {
      #pragma unroll
      for (int i = 0; i < DT * 4; ++i) acc[i] *= alpha[(i >> 1) & 1];
    }
    #pragma unroll
    for (int i = 0; i < NT * 4; ++i) {
      const int r = (i >> 1) & 1;
      const float base_max = row_max[r] == neg_inf ? 0.f : row_max[r];
      s[i] = mlxcel::fast_exp2(s[i] - base_max);
      row_sum[r] += s[i];
    }

    // ---- 3b. O += P V: P in registers (16 tokens a k-step), V transposed ----
    uint32_t p[NT / 2][4];
    #pragma unroll
    for (int kt = 0; kt < NT / 2; ++kt) {
      const float* lo = s + 8 * kt;                // score tiles 2 kt and 2 kt + 1
      p[kt][0] = mlxcel::Mma<TM>::pack(lo[0], lo[1]);
      p[kt][1] = mlxcel::Mma<TM>::pack(lo[2], lo[3]);
      p[kt][2] = mlxcel::Mma<TM>::pack(lo[4], lo[5]);
      p[kt][3] = mlxcel::Mma<TM>::pack(lo[6], lo[7]);
    }
    mlxcel::mma_fence();
    #pragma unroll
    for (int kt = 0; kt < NT / 2; ++kt) {
      mlxcel::values_mma<TM, D>(acc, p[kt], mlxcel::smem_descriptor(values_at + kt * 16 * 128, KV_BLOCK / 16, 64));
    }
    mlxcel::mma_commit();
    mlxcel::mma_wait();
    mlxcel::mma_settle(acc);
    if (PRODUCER && chunk + 2 < chunk_end) mlxcel::barrier_arrive(EMPTY + pair, THREADS + PRODUCER_THREADS);
    buffer = buffer + 1 == STAGES ? 0 : buffer + 1;
  }

  // ---- 5. write: each warp's 16 rows straight from its accumulators ----
  #pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] = mlxcel::lane_sum(mlxcel::lane_sum(row_sum[r], 1), 2);
    const int head = group * ROWS + warp * 16 + g + 8 * r;
    if (head >= heads) continue;
    const float total = row_sum[r];
    const float inverse = total > 0.f ? 1.f / total : 0.f;
    const size_t out_row = size_t(tile) * out_heads + kv_head * heads + head;
    if (tig == 0) out_lse[out_row] = total > 0.f ? row_max[r] + log2f(total) : neg_inf;
    #pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      reinterpret_cast<float2*>(out + out_row * D + dt * 8 + tig * 2)[0] =
          make_float2(acc[dt * 4 + 2 * r] * inverse, acc[dt * 4 + 2 * r + 1] * inverse);
    }
  }
"""

WARPGROUP_PARTIAL_SIGNATURE = (
    "template <typename T, typename TQ, int D, int BLOCK, bool STACKED, int WARPS, int CHUNK, int STAGES, int SCALE_BITS,"
    " typename S>\n__device__ __forceinline__ void warpgroup_partial(const TQ* q, const S& q_shape, const T* k_pool,"
    " const S& k_pool_shape, const T* v_pool, const __half* k_scales, const __half* v_scales, const int32_t* indices, const int32_t* last_page_len,"
    " const int32_t* tiles, const int32_t* members, const S& members_shape, float* out, float* out_lse)")

_WARPGROUP_CALL = ("mlxcel::warpgroup_partial<T, TQ, D, BLOCK, STACKED, WARPS, CHUNK, STAGES, SCALE_BITS>(q, "
                   "q_shape, k_pool, k_pool_shape, v_pool, {scales}, indices, last_page_len, tiles, members, "
                   "members_shape, out, out_lse);")
WARPGROUP_PARTIAL_CALL = _WARPGROUP_CALL.format(scales="nullptr, nullptr")
# int8 pages: the codes as k_pool / v_pool, their scales beside them (the zeros input is not read).
WARPGROUP_QUANTIZED_PARTIAL_CALL = _WARPGROUP_CALL.format(scales="k_scales, v_scales")

