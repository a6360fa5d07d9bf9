"""Fused paged attention for MLX's CUDA backend (``mx.fast.cuda_kernel``).

The host side (tiles, template constants, grid, launches) is ``fused``; this
module holds the CUDA spelling of the two kernels. ``metal.py`` holds the
Metal spelling of the same kernels, section by section in the same order.

Partial kernel, per block = (tile, head group, KV head), WARPS warps:
  1. Q fragments: each warp owns 16 query heads (one m16 tile; heads past the
     KV head's count are zero rows), pre-scaled into the log2 domain.
  2. Staging: 64-token chunks of K and V are copied into shared memory with
     cp.async into a ring of STAGES chunks (two: double-buffered; deeper
     rings are for sweeps), their page-table lookups issued a chunk ahead;
     slots outside the row's valid range (before first_page_offset, past
     last_page_len) are zero-filled so no stale value can reach the sums.
  3. Scores S = Q K^T and O += P V on mma.sync m16n8k16 (bf16/f16 operands,
     float32 accumulators); B operands come from shared memory through
     ldmatrix (transposed for V). Every K/V element is loaded from memory once
     per block and reused by all of its warps' heads.

  Quantized pages (int8, int4) keep that pipeline for their codes: cp.async
  stages the code rows and each token's scales (and zeros) as the pool holds
  them, and ldmatrix reads code bytes into registers where they become
  float16 operands on their way to the mma (int8 keys stay exact codes, the
  token's scale multiplying its scores; int8 values and int4 keys and values
  are dequantized, rounded once to float16). The k order of a fragment's
  codes (and so q's, loaded to match) and the column order of the value
  tiles follow the bytes ldmatrix hands each lane. Converting a chunk to
  16-bit rows in shared memory instead would cost a pass and a barrier a chunk
  and more shared-memory traffic per token than the bytes it saves (int4 1.3
  KB a token and head, against 0.3 KB read in place), and holding the next
  chunk's codes in registers 32 more registers a lane.
  4. Online softmax per 32-token step, in registers (FlashAttention-2 style:
     the S accumulators are repacked as the A operand of the P V product);
     masks only in steps at a row's ends, rescales only when a row's max
     outgrows its exponent base by 2^8.
  5. Warps that split a chunk's tokens merge their states in shared memory;
     the block writes normalized o and log2 lse per (tile, head).

Merge kernel: one warp per (group, head): the exp2-weighted sum of the
group's states, D/32 contiguous floats per lane, their loads issued in batches
of 16 states (one memory round trip for most groups), relative to the largest
lse seen so far.

Cascade merge kernel: the same fold for one cascade decode step, one warp per
(row, head) over the row's private states and, at each depth where the row
is a member of a span, every tile's state of that span at the member's
stacked head; writes the output in q's dtype. With the stacked-q map of the
partial kernel, a cascade step of depth D is D + 2 launches.

How MLX gets them: each kernel is a device function in one library (the
header below plus the three bodies), written once to a file (the user's
cache, else the temp directory); a launch hands MLX only an ``#include`` of
that file and a one-line call. MLX rebuilds and std::hashes a custom
kernel's whole text on every launch (~0.3 us of host encode per KB on the
H200's host, measured with an encode probe), so sending the ~34 KB of a cascade step's three
kernels cost ~10 us a step.
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
import tempfile
from pathlib import Path

import mlx.core as mx

from .cuda_warpgroup import (WARPGROUP_HEADER, WARPGROUP_PARTIAL_CALL, WARPGROUP_PARTIAL_SIGNATURE,
                             WARPGROUP_PARTIAL_SOURCE, WARPGROUP_QUANTIZED_PARTIAL_CALL)
from .fused import MAX_DEPTH, FusedKernels, Platform  # noqa: F401  (MAX_DEPTH: the backend API)

HEADER = r"""
namespace mlxcel {

// MLX 0.32.4's kernel prelude defines no infinity constant.
__device__ __forceinline__ float infinity() {
  return __int_as_float(0x7f800000);
}

// m16n8k16 tensor-core product, D = A B + D. A: 16x16 row-major (4 words),
// B: 16x8 column-major (2 words), D: 16x8 float32 (4 floats per lane).
template <typename T> struct Mma;

template <> struct Mma<__nv_bfloat16> {
  static constexpr bool BF16 = true;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <> struct Mma<__half> {
  static constexpr bool BF16 = false;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 16-bit matrices from shared memory; lanes 8i..8i+7 give matrix i's rows.
__device__ __forceinline__ void load_matrices(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// Two of them (lanes 0..15 give the rows).
__device__ __forceinline__ void load_matrices(uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row)));
}

__device__ __forceinline__ void load_matrices_transposed(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// 16 bytes global -> shared (dst: a shared-window address) without a register
// round trip; zero-filled when !valid.
__device__ __forceinline__ void copy_async(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy_async(void* dst, const void* src, bool valid) {
  copy_async(shared_address(dst), src, valid);
}

// BYTES (4 or 8) global -> shared, zero-filled when !valid (quantized pages'
// scales and zeros); nothing at all unless issue: a predicate, not a branch,
// so the threads that copy none never part from the others.
template <int BYTES>
__device__ __forceinline__ void copy_async_small(uint32_t dst, const void* src, bool valid, bool issue) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n@p cp.async.ca.shared.global [%0], [%1], %2, %3;\n}\n"
               :: "r"(dst), "l"(src), "n"(BYTES), "r"(valid ? BYTES : 0), "r"(int(issue)));
}

__device__ __forceinline__ void copy_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

template <int PENDING>
__device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING));
}

// Elements d and d+1 (d even) in one load.
__device__ __forceinline__ float2 load_pair(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 load_pair(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}

// What a pool's pages hold (kv_quant has the formats). 16-bit pages are the
// matrix units' operands as stored. Quantized pages are staged as codes and
// become float16 operands in registers, on their way from shared memory to
// the mma: float16's 11 bits hold every int8 code exactly and round a
// dequantized value 8x finer than bfloat16's 8 would.
template <typename T> struct PageFormat {          // bfloat16 / float16 elements
  using Operand = T;
  static constexpr int BITS = 16;
  static constexpr bool QUANTIZED = false, AFFINE = false;
};
template <> struct PageFormat<int8_t> {            // code * scale, one scale per token and KV head
  using Operand = __half;
  static constexpr int BITS = 8;
  static constexpr bool QUANTIZED = true, AFFINE = false;
};
template <> struct PageFormat<uint8_t> {           // code * scale + zero per 32 channels, two codes a byte
  using Operand = __half;
  static constexpr int BITS = 4;
  static constexpr bool QUANTIZED = true, AFFINE = true;
};

__device__ __forceinline__ __half2 as_half2(uint32_t x) {
  return *reinterpret_cast<__half2*>(&x);
}
__device__ __forceinline__ uint32_t as_word(__half2 x) {
  return *reinterpret_cast<uint32_t*>(&x);
}

// Two int8 codes of `flipped` (the codes' bytes with their sign bits
// flipped: code + 128), the bytes SELECTOR puts at bytes 0 and 2, as float16
// exactly: below the byte 0x64 a byte b is the float16 1024 + b, and
// 1024 + 128 + code - 1152 is the code.
template <uint32_t SELECTOR>
__device__ __forceinline__ __half2 int8_pair(uint32_t flipped) {
  return __hsub2(as_half2(__byte_perm(flipped, 0x64646464u, SELECTOR)), as_half2(0x64806480u));
}

// The four int4 code pairs of w (pair J: the nibbles at bits 4J..4J+3 of
// each 16-bit half) as float16 exactly, Marlin's way: a nibble masked in
// place under the exponent byte 0x64 (one LOP3) is 1024 + c at bits 0..3 or
// 1024 + 16 c at bits 4..7, then c = x - 1024 or x / 16 - 64 (one HADD2 or
// HFMA2, exact); one shift by 8 serves pairs 2 and 3.
template <uint32_t MASK>
__device__ __forceinline__ __half2 masked_under_bias(uint32_t w) {   // (w & MASK) | 0x64006400 in one LOP3
  uint32_t x;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(x) : "r"(w), "n"(MASK), "n"(0x64006400u));
  return as_half2(x);
}
__device__ __forceinline__ void nibble_pairs(uint32_t w, __half2 (&c)[4]) {
  const __half2 bias = as_half2(0x64006400u), sixteenth = as_half2(0x2c002c00u), minus_64 = as_half2(0xd400d400u);
  const uint32_t high = w >> 8;
  c[0] = __hsub2(masked_under_bias<0x000f000fu>(w), bias);
  c[1] = __hfma2(masked_under_bias<0x00f000f0u>(w), sixteenth, minus_64);
  c[2] = __hsub2(masked_under_bias<0x000f000fu>(high), bias);
  c[3] = __hfma2(masked_under_bias<0x00f000f0u>(high), sixteenth, minus_64);
}

// One MUFU.EX2: exp2f's denormal handling costs three more instructions a
// call, and a weight under 2^-126 adds nothing to a float32 sum anyway.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float lane_max(float x, int mask) {
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, mask));
}

__device__ __forceinline__ float lane_sum(float x, int mask) {
  return x + __shfl_xor_sync(0xffffffffu, x, mask);
}

// VEC consecutive elements from p as floats, in as few loads as their width
// allows (p is aligned to VEC elements): pairs, or single elements.
template <int VEC, typename T>
__device__ __forceinline__ void load_row(const T* p, float (&x)[VEC]) {
  if constexpr (VEC % 2 == 0) {
    #pragma unroll
    for (int k = 0; k < VEC; k += 2) {
      const float2 v = load_pair(p + k);
      x[k] = v.x; x[k + 1] = v.y;
    }
  } else {
    #pragma unroll
    for (int k = 0; k < VEC; ++k) x[k] = static_cast<float>(p[k]);
  }
}
// Float rows four at a time where VEC allows.
template <int VEC>
__device__ __forceinline__ void load_row(const float* p, float (&x)[VEC]) {
  if constexpr (VEC % 4 == 0) {
    #pragma unroll
    for (int k = 0; k < VEC; k += 4) {
      const float4 v = *reinterpret_cast<const float4*>(p + k);
      x[k] = v.x; x[k + 1] = v.y; x[k + 2] = v.z; x[k + 3] = v.w;
    }
  } else {
    load_row<VEC, float>(p, x);
  }
}

// A step of the online softmax (both partial kernels), this lane's two rows
// (a row: one query head, whose other scores lanes LOW..HIGH apart hold: 1..2
// where heads are the mma's rows, 4..16 where they are its columns), log2
// domain: from the step's maxima, the rows' exponent base (row_max) moves
// only when a row's scores outgrow it by 2^8, for the whole warp at once:
// weights stay <= 2^8, far from float32's range, and most steps skip
// rescaling the accumulators (FlashAttention-4's conditional rescale).
// Returns whether it moved; then the row sums are rescaled and alpha holds
// the factor the caller's accumulators take. A row over 8 lanes is checked
// on each lane's own scores (a lane's outgrowing the base is its row's), its
// maxima gathered only when it moves: most steps skip its 3 shuffles, and the
// transposed int8 kernel two registers fewer (five blocks an SM, not four).
// A row over 4 lanes is gathered first: checked on its own, the float
// kernel's two-tile layout takes one register more than three blocks allow.
template <int LOW = 1, int HIGH = 2>
__device__ __forceinline__ bool rebase(const float (&step_max)[2], float (&row_max)[2], float (&row_sum)[2],
                                       float (&alpha)[2]) {
  constexpr float SLACK = 8.f;                      // log2 units
  constexpr bool GATHER_FIRST = HIGH / LOW < 4;
  auto gathered = [](float x) {
    #pragma unroll
    for (int mask = LOW; mask <= HIGH; mask *= 2) x = lane_max(x, mask);
    return x;
  };
  float top[2];
  bool grow = false;
  #pragma unroll
  for (int r = 0; r < 2; ++r) {
    if constexpr (GATHER_FIRST) top[r] = gathered(step_max[r]);
    grow |= (GATHER_FIRST ? top[r] : step_max[r]) > row_max[r] + SLACK;
  }
  if (!__any_sync(0xffffffffu, grow)) return false;
  #pragma unroll
  for (int r = 0; r < 2; ++r) {
    if constexpr (!GATHER_FIRST) top[r] = gathered(step_max[r]);
    const float moved = fmaxf(row_max[r], top[r]);
    alpha[r] = moved == -infinity() ? 1.f : fast_exp2(row_max[r] - moved);
    row_max[r] = moved;
    row_sum[r] *= alpha[r];
  }
  return true;
}

// An 8x8 matrix of 16-bit elements, held as an mma fragment's word (lane l:
// row l / 4, columns 2 (l % 4) and + 1), transposed across the warp.
__device__ __forceinline__ uint32_t transposed(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// A quantized stage's scales after its K and V code rows: per token its K
// scales, V scales (int4: then K zeros, V zeros), BYTES each. An int8 row's
// one scale comes as the aligned 4-byte pair holding it (cp.async copies no
// less); the other half is the next or the previous row's (int8_half).
template <bool AFFINE, int D> struct ScaleRows {
  static constexpr int BYTES = AFFINE ? D / 32 * 2 : 4;
  static constexpr int ARRAYS = AFFINE ? 4 : 2;
  template <int CHUNK, int CODE_STRIDE>
  static constexpr int STAGE = 2 * CHUNK * CODE_STRIDE + ARRAYS * CHUNK * BYTES;   // a whole stage's bytes
};

// A block's copies of a page tile's chunks into shared memory (both partial
// kernels): a chunk's token rows of VECS 16-byte pieces, one pass of the
// block's threads copying PASS_ROWS rows. A chunk of whole pages whose passes
// never straddle a page (ALIGNED): each pass's page and row within it are
// compile-time functions of the pass, so one lookup serves all the passes of
// a page.
template <int VECS, int THREADS, int CHUNK, int BLOCK>
struct ChunkCopies {
  static constexpr int PASS_ROWS = THREADS / VECS;
  static constexpr bool ALIGNED = CHUNK % BLOCK == 0 && BLOCK % PASS_ROWS == 0;
  static constexpr int LOOKUPS = ALIGNED ? CHUNK / BLOCK : CHUNK / PASS_ROWS;
  static constexpr int D = VECS * 8;              // a 16-bit row's elements (copy_rows)
  const int32_t* indices;
  int page_begin, page_count, first_slot, end_slot, kv_heads, kv_head;
  int pass_row, part;          // this thread's row in a pass, its piece of the row
  // 16-bit pages: a page's elements, this thread's first element in a page,
  // and the elements from one copy pass's rows to the next's.
  size_t page_elements;
  int page_offset, pass_elements;

  __device__ __forceinline__ ChunkCopies(const int32_t* indices, int page_begin, int page_count, int first_slot,
                                         int end_slot, int kv_heads, int kv_head, int thread = threadIdx.x)
      : indices(indices), page_begin(page_begin), page_count(page_count), first_slot(first_slot),
        end_slot(end_slot), kv_heads(kv_heads), kv_head(kv_head), pass_row(thread / VECS),
        part(thread % VECS), page_elements(size_t(BLOCK) * kv_heads * D),
        page_offset((pass_row * kv_heads + kv_head) * D + part * 8), pass_elements(PASS_ROWS * kv_heads * D) {}

  // A chunk's page lookups, all in flight together, issued a chunk before its
  // copies need them. They stay raw page numbers until the copies use them:
  // arithmetic on a load right after it is issued would wait out its round
  // trip there, every chunk. Chunks past the tile read its last page:
  // harmless, never staged.
  __device__ __forceinline__ void lookup(int chunk, int (&pages)[LOOKUPS]) const {
    #pragma unroll
    for (int p = 0; p < LOOKUPS; ++p) {
      const int page = ALIGNED ? chunk * (CHUNK / BLOCK) + p : (chunk * CHUNK + p * PASS_ROWS + pass_row) / BLOCK;
      pages[p] = indices[page_begin + min(page, page_count - 1)];
    }
  }

  // A ring of STAGES chunks: the first STAGES - 1 staged (stage(chunk,
  // buffer, pages): one copy group each, empty past the tile's end), the
  // next chunk's pages looked up.
  template <int STAGES, typename Stage>
  __device__ __forceinline__ void fill(int chunk_begin, int chunk_end, int (&pages)[LOOKUPS], Stage stage) const {
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      lookup(chunk_begin + s, pages);
      if (chunk_begin + s < chunk_end) stage(chunk_begin + s, s, pages);
      else copy_commit();
    }
    lookup(chunk_begin + STAGES - 1, pages);
  }

  // After chunk's wait and barrier: the chunk STAGES - 1 on into the buffer
  // read an iteration ago (the one before this chunk's), the next pages looked up.
  template <int STAGES, typename Stage>
  __device__ __forceinline__ void refill(int chunk, int chunk_end, int buffer, int (&pages)[LOOKUPS],
                                         Stage stage) const {
    if (chunk + STAGES - 1 < chunk_end) {
      stage(chunk + STAGES - 1, buffer == 0 ? STAGES - 1 : buffer - 1, pages);
      lookup(chunk + STAGES, pages);
    } else {
      copy_commit();
    }
  }

  // Quantized pages: the chunk's K and V code rows (ROW_BYTES each, CODE_STRIDE
  // apart) at keys and after them, then each token's scales (and zeros) as
  // ScaleRows lays them out; invalid slots read nothing (zero codes, zero
  // scales: weightless). A row's scales travel with its first pieces, piece
  // a % VECS copying array a's: every thread issues each array's copy under
  // a predicate, so none branches or holds a chosen array's address.
  template <bool AFFINE, int ROW_BYTES, int CODE_STRIDE, typename C>
  __device__ __forceinline__ void copy_code_rows(const C* k_pool, const C* v_pool, const __half* k_scales,
                                                 const __half* v_scales, const __half* k_zeros,
                                                 const __half* v_zeros, const int (&pages)[LOOKUPS], int chunk,
                                                 bool at_ends, unsigned char* keys) const {
    using Scales = ScaleRows<AFFINE, ROW_BYTES * (AFFINE ? 2 : 1)>;
    // This thread's piece of pass 0's rows and its scale row, as shared-window
    // addresses: each copy's is one of them plus a constant, for ptxas to fold
    // into the copy's own offset. Values follow keys; then the scales,
    // [Scales::ARRAYS][CHUNK][Scales::BYTES].
    const uint32_t piece_at = shared_address(keys) + pass_row * CODE_STRIDE + part * 16;
    const uint32_t scale_at = shared_address(keys) + 2 * CHUNK * CODE_STRIDE + pass_row * Scales::BYTES;
    #pragma unroll
    for (int j = 0; j < CHUNK / PASS_ROWS; ++j) {
      const int slot_in_chunk = j * PASS_ROWS + pass_row;
      const int slot = chunk * CHUNK + slot_in_chunk;
      const bool valid = !at_ends || (slot >= first_slot && slot < end_slot);
      const int page_row = ALIGNED ? j * PASS_ROWS % BLOCK + pass_row : slot % BLOCK;
      // The (token, KV head) row's index in the pool, 64-bit from the page's base.
      const size_t at = size_t(pages[ALIGNED ? j * PASS_ROWS / BLOCK : j]) * (BLOCK * kv_heads) +
                        (page_row * kv_heads + kv_head);
      copy_async(piece_at + j * PASS_ROWS * CODE_STRIDE, k_pool + at * ROW_BYTES + part * 16, valid);
      copy_async(piece_at + (CHUNK + j * PASS_ROWS) * CODE_STRIDE, v_pool + at * ROW_BYTES + part * 16, valid);
      #pragma unroll
      for (int a = 0; a < Scales::ARRAYS; ++a) {
        const __half* array = a == 0 ? k_scales : a == 1 ? v_scales : a == 2 ? k_zeros : v_zeros;
        const __half* src = AFFINE ? array + at * (Scales::BYTES / 2) : array + (at & ~size_t(1));
        copy_async_small<Scales::BYTES>(scale_at + (a * CHUNK + j * PASS_ROWS) * Scales::BYTES, src, valid,
                                        part == a % VECS);
      }
    }
    copy_commit();
  }

  // copy(at_ends) stages the chunk; at_ends: it holds one of the row's ends,
  // so its slots are checked; the chunks between copy every slot.
  template <typename Copy>
  __device__ __forceinline__ void stage(int chunk, Copy copy) const {
    if (chunk * CHUNK >= first_slot && (chunk + 1) * CHUNK <= end_slot) copy(false);
    else copy(true);
  }

  // 16-bit pages: the chunk's K and V rows, slot s's piece c to byte
  // to(s, c) of keys and of values; invalid slots read nothing (zero-fill).
  template <typename T, typename To>
  __device__ __forceinline__ void copy_rows(const T* k_pool, const T* v_pool, const int (&pages)[LOOKUPS], int chunk,
                                            bool at_ends, unsigned char* keys, unsigned char* values, To to) const {
    // 64-bit arithmetic once a page (a pool may hold over 2^31 elements): its
    // base at this thread's offset; a pass is a 32-bit step on.
    size_t page_at[LOOKUPS];
    #pragma unroll
    for (int p = 0; p < LOOKUPS; ++p) page_at[p] = size_t(pages[p]) * page_elements;
    #pragma unroll
    for (int j = 0; j < CHUNK / PASS_ROWS; ++j) {
      const int slot_in_chunk = j * PASS_ROWS + pass_row;
      const int slot = chunk * CHUNK + slot_in_chunk;
      const bool valid = !at_ends || (slot >= first_slot && slot < end_slot);
      const size_t at = ALIGNED
          ? page_at[j * PASS_ROWS / BLOCK] + (page_offset + j % (BLOCK / PASS_ROWS) * pass_elements)
          : page_at[j] + ((slot % BLOCK * kv_heads + kv_head) * D + part * 8);
      const uint32_t byte = to(slot_in_chunk, part);
      copy_async(keys + byte, k_pool + at, valid);
      copy_async(values + byte, v_pool + at, valid);
    }
    copy_commit();
  }
};

// Folds states 0..n-1 (lse_at(i): the state's log2 sum, row_at(i): this
// lane's VEC elements of its normalized row) into top (the largest lse),
// total and value, weighted by exp2(lse - top). A batch's loads, lse and
// rows, are all issued before any is used (a warp per output row, few warps
// per SM, so the fold waits on memory): up to BATCH states cost one round
// trip, and a later batch rescales what came before. Slots past n load
// nothing and weigh 0; a weightless state (lse -inf) may hold anything, so it
// is selected away, never multiplied.
template <int VEC, typename LseAt, typename RowAt>
__device__ __forceinline__ void fold_states(int n, LseAt lse_at, RowAt row_at, float& top, float& total,
                                            float (&value)[VEC]) {
  constexpr int BATCH = 16;
  const float neg_inf = -infinity();
  top = neg_inf;
  total = 0.f;
  #pragma unroll
  for (int k = 0; k < VEC; ++k) value[k] = 0.f;
  for (int first = 0; first < n; first += BATCH) {
    float lse[BATCH], x[BATCH][VEC] = {};
    #pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      lse[b] = neg_inf;
      if (first + b < n) {
        lse[b] = lse_at(first + b);
        load_row(row_at(first + b), x[b]);
      }
    }
    float batch_top = neg_inf;
    #pragma unroll
    for (int b = 0; b < BATCH; ++b) batch_top = fmaxf(batch_top, lse[b]);
    if (batch_top == neg_inf) continue;            // no weight in this batch
    const float new_top = fmaxf(top, batch_top);
    const float rescale = exp2f(top - new_top);    // 0 while nothing was weighted
    total *= rescale;
    #pragma unroll
    for (int k = 0; k < VEC; ++k) value[k] *= rescale;
    top = new_top;
    #pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const float weight = exp2f(lse[b] - top);
      total += weight;
      #pragma unroll
      for (int k = 0; k < VEC; ++k) value[k] += weight > 0.f ? weight * x[b][k] : 0.f;
    }
  }
}

// One (row, query head)'s cascade output as fold_states leaves it: the
// private states (private_states of them, private_lse(i) / private_row(i)
// their lse's and rows' base addresses) and, at each depth where the row is a
// member of a span, every tile's state of that span at the member's stacked
// head kv * (M * G) + m * G + g, M the level's stacked width, G the model's
// query heads a KV head (level_map: the
// first tile, the tiles, the member's slot; no tiles for a row in no span).
// MEMBER_IS_ROW: one span, every row a member, member m being row m, so no
// lookup comes before the states' loads (member_tiles: that span's tiles).
template <int VEC, int DEPTHS, bool MEMBER_IS_ROW, typename PrivateLse, typename PrivateRow>
__device__ __forceinline__ void fold_cascade(int row, int head, int q_heads, int G, int private_states,
                                             PrivateLse private_lse, PrivateRow private_row,
                                             const float* const (&level_o)[4], const float* const (&level_lse)[4],
                                             const int (&level_heads)[4], int member_tiles, const int32_t* level_map,
                                             int lane, float& top, float& total, float (&value)[VEC]) {
  int first[DEPTHS], count[DEPTHS], head_at[DEPTHS];
  int levels = 0;
  #pragma unroll
  for (int d = 0; d < DEPTHS; ++d) {
    const int32_t* entry = level_map + (size_t(row) * DEPTHS + d) * 3;
    first[d] = MEMBER_IS_ROW ? 0 : entry[0];
    count[d] = MEMBER_IS_ROW ? member_tiles : entry[1];
    const int slot = MEMBER_IS_ROW ? row : entry[2];
    head_at[d] = (head / G) * (level_heads[d] / q_heads * G) + slot * G + head % G;
    levels += count[d];
  }
  // The levels' states first, then the private ones: where those are in
  // shared memory (the private level merging), a span's 16 tiles are one
  // batch of loads, one round trip. A state's address by selection, not by
  // branch: every candidate is computed, so fold_states can have a batch's
  // loads in flight at once.
  auto lse_of = [&](int i) -> const float* {
    const float* at = private_lse(i - levels);
    int j = i;
    #pragma unroll
    for (int d = 0; d < DEPTHS; ++d) {
      const float* level = level_lse[d] + size_t(first[d] + j) * level_heads[d] + head_at[d];
      at = j >= 0 && j < count[d] ? level : at;
      j -= count[d];
    }
    return at;
  };
  auto row_of = [&](int i) -> const float* {
    const float* at = private_row(i - levels);
    int j = i;
    #pragma unroll
    for (int d = 0; d < DEPTHS; ++d) {
      const float* level = level_o[d] + (size_t(first[d] + j) * level_heads[d] + head_at[d]) * (VEC * 32);
      at = j >= 0 && j < count[d] ? level : at;
      j -= count[d];
    }
    return at + lane * VEC;
  };
  fold_states(levels + private_states, [&](int i) { return *lse_of(i); }, row_of, top, total, value);
}

}  // namespace mlxcel
"""

PARTIAL_SOURCE = r"""
  // ---- constants and coordinates ----
  using Format = mlxcel::PageFormat<T>;
  using TM = typename Format::Operand;              // the matrix units' operand type
  constexpr bool QUANTIZED = Format::QUANTIZED;
  constexpr int THREADS = WARPS * 32;
  constexpr int SPLIT = WARPS / WM;                 // warps sharing one 16-head tile, splitting tokens
  constexpr int WARP_TOKENS = CHUNK / SPLIT;        // tokens of each chunk one warp reads
  constexpr int STEP = WARP_TOKENS < 32 ? WARP_TOKENS : 32;
  constexpr int NT = STEP / 8;                      // score tiles (8 tokens) per step
  // HEADS_ON_N (quantized pages, at most 8 heads a block, the host's choice): the
  // products transposed, S^T = K Q^T and O^T = V^T P^T, so a KV head's few
  // query heads are an n8 tile's columns, not 4 of an m16 tile's 16 rows:
  // half the mma's, half the softmax a lane, half the accumulators.
  constexpr int MT = STEP / 16;                     // HEADS_ON_N: score tiles (16 tokens) per step
  constexpr int TILE_HEADS = HEADS_ON_N ? 8 : 16;   // a warp's heads
  static_assert(!HEADS_ON_N || (QUANTIZED && WM == 1 && STEP % 16 == 0),
                "quantized pages, one warp across the heads, whole m16 tiles");
  constexpr int DK = D / 16;                        // k-steps of Q K^T
  constexpr int DT = D / 8;                         // output tiles (8 dims)
  constexpr int STRIDE = D + 8;                     // padded shared row: conflict-free ldmatrix
  constexpr int ROW_BYTES = D * Format::BITS / 8;   // a token's K (or V) elements, or codes, in one KV head
  constexpr int VECS = ROW_BYTES / 16;              // 16-byte vectors per token row
  constexpr int STAGE = CHUNK * STRIDE;
  // A quantized stage (ChunkCopies::copy_code_rows): code rows padded by 16
  // bytes, rows an odd number of 16-byte units apart (conflict-free ldmatrix).
  constexpr int CODE_STRIDE = ROW_BYTES + 16;
  constexpr int SCALE_BYTES = mlxcel::ScaleRows<Format::AFFINE, D>::BYTES;
  constexpr int CODE_STAGE = mlxcel::ScaleRows<Format::AFFINE, D>::template STAGE<CHUNK, CODE_STRIDE>;
  const float scale = __int_as_float(SCALE_BITS);
  const float neg_inf = -mlxcel::infinity();

  const int kv_heads = k_pool_shape[2];
  const int q_heads = q_shape[1];
  const int group_size = q_heads / kv_heads;        // G: the model's query heads per KV head
  // Query heads of this KV head: G, or M * G when STACKED (a cascade level,
  // a row per span, members [spans, M]: member m's head kv * G + g is stacked
  // head kv * (M * G) + m * G + g; a narrower span's padding repeats a member).
  const int heads = STACKED ? members_shape[1] * group_size : group_size;
  const int out_heads = kv_heads * heads;
  const int groups = ((heads + 15) / 16 + WM - 1) / WM;
  const int tile = blockIdx.x / groups;
  const int group = blockIdx.x % groups;
  const int kv_head = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp % WM, warp_t = warp / WM;
  const int g = lane / 4, tig = lane % 4;
  const int head0 = (group * WM + warp_m) * 16;     // this warp's first head within the KV head
  const bool active = head0 < heads;

  const int* geometry = tiles + 5 * tile;
  const int row = geometry[0], page_begin = geometry[1], page_count = geometry[2];
  const int first_slot = geometry[3];
  const int end_slot = page_count * BLOCK - (geometry[4] ? BLOCK - last_page_len[row] : 0);

  extern __shared__ __align__(16) unsigned char mlxcel_shared[];
  T* staged = reinterpret_cast<T*>(mlxcel_shared);   // [STAGES][K, V][CHUNK][STRIDE]

  // ---- 1. Q fragments (A operand, rows g and g+8, cols tig*2 and tig*2+8) ----
  // HEADS_ON_N: the B operand, Q^T (k rows tig*2 and tig*2+8, column g), in
  // qf[kk][0..1].
  uint32_t qf[DK][4];
  #pragma unroll
  for (int kk = 0; kk < DK; ++kk) {
    #pragma unroll
    for (int r = 0; r < (HEADS_ON_N ? 2 : 4); ++r) {
      // Every lane loads (a real head's address), rows past the heads become
      // zeros: no branch, so all the loads are in flight together.
      const int head = HEADS_ON_N ? head0 + g : head0 + g + 8 * (r & 1);
      const int real = min(head, heads - 1);
      const int half = HEADS_ON_N ? r : r >> 1;    // the k half: cols (rows of B) tig*2 or tig*2+8
      // The dims of the pair: d and d + 1 of 16-bit pages; quantized pages'
      // codes reach the mma in another k order (a dot product's terms can be
      // summed in any order as long as q's follow): int8 d, d + 1 with d =
      // 16 kk + 4 tig + 2 half, int4 d, d + 4 with d = 32 (kk / 2) +
      // 8 tig + 2 (kk % 2) + half (see 3a).
      const int d = !QUANTIZED ? kk * 16 + 8 * half + tig * 2
                    : Format::AFFINE ? 32 * (kk >> 1) + 8 * tig + 2 * (kk & 1) + half
                                     : kk * 16 + 4 * tig + 2 * half;
      const int q_row = STACKED ? members[row * members_shape[1] + real / group_size] : row;
      const int q_head = kv_head * group_size + real % group_size;
      const TQ* at = q + (size_t(q_row) * q_heads + q_head) * D + d;
      const float2 x = Format::AFFINE ? make_float2(static_cast<float>(at[0]), static_cast<float>(at[4]))
                                      : mlxcel::load_pair(at);
      qf[kk][r] = head < heads ? mlxcel::Mma<TM>::pack(x.x * scale, x.y * scale) : 0u;
    }
  }

  // ---- 2. staging ----
  using Copies = mlxcel::ChunkCopies<VECS, THREADS, CHUNK, BLOCK>;
  constexpr int LOOKUPS = Copies::LOOKUPS;
  const Copies copies(indices, page_begin, page_count, first_slot, end_slot, kv_heads, kv_head);
  auto stage = [&](int chunk, int buffer, const int (&pages)[LOOKUPS]) {
    copies.stage(chunk, [&](bool at_ends) {
      if constexpr (QUANTIZED) {
        unsigned char* keys = mlxcel_shared + buffer * CODE_STAGE;
        copies.template copy_code_rows<Format::AFFINE, ROW_BYTES, CODE_STRIDE>(
            k_pool, v_pool, k_scales, v_scales, k_zeros, v_zeros, pages, chunk, at_ends, keys);
      } else {
        unsigned char* keys = reinterpret_cast<unsigned char*>(staged + (2 * buffer) * STAGE);
        copies.copy_rows(k_pool, v_pool, pages, chunk, at_ends, keys, keys + STAGE * sizeof(T),
                         [](int row, int piece) { return uint32_t((row * STRIDE + piece * 8) * sizeof(T)); });
      }
    });
  };
  // Which half of a staged int8 scale word is this KV head's: the row index's
  // parity, (token * kv_heads + kv_head) % 2 (pages of an even token count).
  const int scale_half[2] = {kv_head & 1, (kv_heads + kv_head) & 1};   // even, odd tokens
  // HEADS_ON_N: tokens g and g + 8's (of a tile: one parity), chosen, not
  // indexed (a runtime index would put scale_half in local memory).
  const int g_half = g & 1 ? scale_half[1] : scale_half[0];

  constexpr int ACC_TILES = HEADS_ON_N ? D / 16 : DT;   // HEADS_ON_N: O^T's m16 tiles of dims
  // HEADS_ON_N, int8: a weight times its token's value scale is rounded to
  // float16, lifted by this power of two so that small ones stay normal (a
  // weight of 2^-10 against a scale of 2^-10: 2^-20 would be subnormal), the
  // sums taken down again at the write. At most 127: the lifted product stays
  // below the largest value a code times its scale could be.
  constexpr float VALUE_LIFT = 64.f;
  float acc[ACC_TILES][4];
  #pragma unroll
  for (int dt = 0; dt < ACC_TILES; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;
  // Rows g, g+8 (HEADS_ON_N: heads 2 tig, 2 tig + 1); log2 domain.
  float row_max[2] = {neg_inf, neg_inf};
  float row_sum[2] = {0.f, 0.f};                   // this lane's share until the final reduction

  // A ring of STAGES chunks, STAGES - 1 of them in flight while one is read.
  // Every iteration commits one copy group (empty past the tile's end), so
  // waiting for all but the newest STAGES - 2 groups always means this chunk
  // has landed; the barrier after the wait also tells every warp that the
  // buffer staged next (read an iteration ago) is free.
  const int chunk_begin = first_slot / CHUNK;
  const int chunk_end = (end_slot + CHUNK - 1) / CHUNK;
  int pages[LOOKUPS];
  copies.template fill<STAGES>(chunk_begin, chunk_end, pages, stage);
  int buffer = 0;                                  // this chunk's; the one staged next is the one before it
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    mlxcel::copy_wait<STAGES - 2>();
    __syncthreads();
    copies.template refill<STAGES>(chunk, chunk_end, buffer, pages, stage);
    if (active) {
      const T* keys = staged + (2 * buffer) * STAGE;
      const T* values = keys + STAGE;
      const unsigned char* key_codes = mlxcel_shared + buffer * CODE_STAGE;   // a quantized stage (see stage())
      const unsigned char* value_codes = key_codes + CHUNK * CODE_STRIDE;
      const unsigned char* scale_rows = value_codes + CHUNK * CODE_STRIDE;
      #pragma unroll
      for (int step = 0; step < WARP_TOKENS / STEP; ++step) {
        const int token0 = warp_t * WARP_TOKENS + step * STEP;
        const int slot0 = chunk * CHUNK + token0;
        if constexpr (HEADS_ON_N) {
          // 3a, 4 and 3b transposed (HEADS_ON_N).
          // S^T = K Q^T: ldmatrix over code rows as 3a's, its four matrices
          // tokens 0..7 and 8..15 of units m and m + 1, gives lane (g, tig)
          // bytes 4 tig..4 tig + 3 of tokens g and g + 8 in unit m: the A
          // operand's k pairs in 3a's k order (int4: dequantized with each
          // token's scale and zero of group m), q's B operand matching. Two
          // chains of k-steps for two mma's in flight.
          constexpr int UNITS = ROW_BYTES / 16;
          constexpr int ROW_HALVES = SCALE_BYTES / 2;   // int4: a token's scales (zeros), a group each
          // This lane's address in a 16-token tile for ldmatrix: its row
          // (tokens 0..7, 8..15) and unit (m, m + 1).
          auto matrix_row = [&](const unsigned char* codes, int tile0) {
            return codes + (tile0 + (lane & 7) + ((lane >> 3) & 1) * 8) * CODE_STRIDE + (lane >> 4) * 16;
          };
          float st[MT][4];          // tokens g, g + 8 (of the tile) x heads 2 tig, 2 tig + 1
          #pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            float chain[2][4] = {};
            const int tile0 = token0 + mt * 16;
            const unsigned char* key_row = matrix_row(key_codes, tile0);
            #pragma unroll
            for (int m = 0; m < UNITS; m += 2) {
              uint32_t w[4];
              mlxcel::load_matrices(w, key_row + m * 16);
              #pragma unroll
              for (int i = 0; i < 2; ++i) {
                if constexpr (Format::AFFINE) {
                  const __half* scales_of = reinterpret_cast<const __half*>(scale_rows) + m + i;
                  const __half* zeros_of = reinterpret_cast<const __half*>(scale_rows + 2 * CHUNK * SCALE_BYTES) + m + i;
                  const __half2 s_lo = __half2half2(scales_of[(tile0 + g) * ROW_HALVES]);
                  const __half2 s_hi = __half2half2(scales_of[(tile0 + g + 8) * ROW_HALVES]);
                  const __half2 z_lo = __half2half2(zeros_of[(tile0 + g) * ROW_HALVES]);
                  const __half2 z_hi = __half2half2(zeros_of[(tile0 + g + 8) * ROW_HALVES]);
                  __half2 lo[4], hi[4];
                  mlxcel::nibble_pairs(w[2 * i], lo);
                  mlxcel::nibble_pairs(w[2 * i + 1], hi);
                  #pragma unroll
                  for (int k = 0; k < 2; ++k) {
                    const uint32_t a[4] = {mlxcel::as_word(__hfma2(lo[2 * k], s_lo, z_lo)),
                                           mlxcel::as_word(__hfma2(hi[2 * k], s_hi, z_hi)),
                                           mlxcel::as_word(__hfma2(lo[2 * k + 1], s_lo, z_lo)),
                                           mlxcel::as_word(__hfma2(hi[2 * k + 1], s_hi, z_hi))};
                    mlxcel::Mma<TM>::run(chain[k], a, qf[2 * (m + i) + k][0], qf[2 * (m + i) + k][1]);
                  }
                } else {
                  const uint32_t lo = w[2 * i] ^ 0x80808080u, hi = w[2 * i + 1] ^ 0x80808080u;
                  const uint32_t a[4] = {
                      mlxcel::as_word(mlxcel::int8_pair<0x4140>(lo)), mlxcel::as_word(mlxcel::int8_pair<0x4140>(hi)),
                      mlxcel::as_word(mlxcel::int8_pair<0x4342>(lo)), mlxcel::as_word(mlxcel::int8_pair<0x4342>(hi))};
                  mlxcel::Mma<TM>::run(chain[i], a, qf[m + i][0], qf[m + i][1]);
                }
              }
            }
            if constexpr (Format::AFFINE) {
              #pragma unroll
              for (int c = 0; c < 4; ++c) st[mt][c] = chain[0][c] + chain[1][c];
            } else {
              const __half* key_scales = reinterpret_cast<const __half*>(scale_rows) + g_half;
              const float low = __half2float(key_scales[2 * (tile0 + g)]);
              const float high = __half2float(key_scales[2 * (tile0 + g + 8)]);
              #pragma unroll
              for (int c = 0; c < 4; ++c) st[mt][c] = (chain[0][c] + chain[1][c]) * (c < 2 ? low : high);
            }
          }
          if (slot0 < first_slot || slot0 + STEP > end_slot) {
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              #pragma unroll
              for (int c = 0; c < 4; ++c) {
                const int slot = slot0 + mt * 16 + g + 8 * (c >> 1);
                if (slot < first_slot || slot >= end_slot) st[mt][c] = neg_inf;
              }
            }
          }
          float step_max[2] = {neg_inf, neg_inf};
          #pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            #pragma unroll
            for (int c = 0; c < 4; ++c) step_max[c & 1] = fmaxf(step_max[c & 1], st[mt][c]);
          }
          float alpha[2];
          if (mlxcel::rebase<4, 16>(step_max, row_max, row_sum, alpha)) {
            #pragma unroll
            for (int u = 0; u < ACC_TILES; ++u) {
              acc[u][0] *= alpha[0]; acc[u][1] *= alpha[1];
              acc[u][2] *= alpha[0]; acc[u][3] *= alpha[1];
            }
          }
          #pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            #pragma unroll
            for (int c = 0; c < 4; ++c) {
              const float base = row_max[c & 1] == neg_inf ? 0.f : row_max[c & 1];
              st[mt][c] = mlxcel::fast_exp2(st[mt][c] - base);
              row_sum[c & 1] += st[mt][c];
            }
          }
          // O^T += V^T P^T: P^T's B operand is this lane's weights, packed
          // (rows: tokens g, g + 8; columns: heads), each 8x8 transposed. V^T's
          // A operand from ldmatrix.trans as 3b's, tokens 2 tig, + 1 (+ 8, + 9)
          // its k pairs. int4: dequantized with their tokens' scales and zeros
          // of group c. int8: exact float16 integers, a token's scale riding
          // on its weights (tokens g and g + 8, of one parity: one multiply a
          // weight, not one HMUL2 a code pair; 1.02-1.04x on an H100),
          // lifted by VALUE_LIFT into float16's normal range. int8:
          // unit c's dims 16 c + 2 g and + 1 are rows g and g + 8 of tile c;
          // int4: its dims 32 c + 4 g + 2 v and + 1 those of tile 2 c + v (see 5).
          #pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const int tile0 = token0 + mt * 16;
            const __half* scales_of = reinterpret_cast<const __half*>(scale_rows + CHUNK * SCALE_BYTES);
            float low = 1.f, high = 1.f;
            if constexpr (!Format::AFFINE) {
              low = __half2float(scales_of[2 * (tile0 + g) + g_half]) * VALUE_LIFT;
              high = __half2float(scales_of[2 * (tile0 + g + 8) + g_half]) * VALUE_LIFT;
            }
            const uint32_t b0 = mlxcel::transposed(mlxcel::Mma<TM>::pack(st[mt][0] * low, st[mt][1] * low));
            const uint32_t b1 = mlxcel::transposed(mlxcel::Mma<TM>::pack(st[mt][2] * high, st[mt][3] * high));
            const int pair = tile0 + 2 * tig;      // int4: this lane's tokens (its k pairs)
            const __half* zeros_of = reinterpret_cast<const __half*>(scale_rows + 3 * CHUNK * SCALE_BYTES);
            const unsigned char* value_row = matrix_row(value_codes, tile0);
            #pragma unroll
            for (int c = 0; c < UNITS; c += 2) {
              uint32_t w[4];
              mlxcel::load_matrices_transposed(w, value_row + c * 16);
              #pragma unroll
              for (int h = 0; h < 2; ++h) {
                if constexpr (Format::AFFINE) {
                  const __half* sc = scales_of + c + h;
                  const __half* zr = zeros_of + c + h;
                  const __half2 sl = __halves2half2(sc[pair * ROW_HALVES], sc[(pair + 1) * ROW_HALVES]);
                  const __half2 sh = __halves2half2(sc[(pair + 8) * ROW_HALVES], sc[(pair + 9) * ROW_HALVES]);
                  const __half2 zl = __halves2half2(zr[pair * ROW_HALVES], zr[(pair + 1) * ROW_HALVES]);
                  const __half2 zh = __halves2half2(zr[(pair + 8) * ROW_HALVES], zr[(pair + 9) * ROW_HALVES]);
                  __half2 lo[4], hi[4];
                  mlxcel::nibble_pairs(w[2 * h], lo);
                  mlxcel::nibble_pairs(w[2 * h + 1], hi);
                  #pragma unroll
                  for (int v = 0; v < 2; ++v) {
                    const uint32_t a[4] = {mlxcel::as_word(__hfma2(lo[2 * v], sl, zl)),
                                           mlxcel::as_word(__hfma2(lo[2 * v + 1], sl, zl)),
                                           mlxcel::as_word(__hfma2(hi[2 * v], sh, zh)),
                                           mlxcel::as_word(__hfma2(hi[2 * v + 1], sh, zh))};
                    mlxcel::Mma<TM>::run(acc[2 * (c + h) + v], a, b0, b1);
                  }
                } else {
                  const uint32_t lo = w[2 * h] ^ 0x80808080u, hi = w[2 * h + 1] ^ 0x80808080u;
                  const uint32_t a[4] = {
                      mlxcel::as_word(mlxcel::int8_pair<0x4240>(lo)), mlxcel::as_word(mlxcel::int8_pair<0x4341>(lo)),
                      mlxcel::as_word(mlxcel::int8_pair<0x4240>(hi)), mlxcel::as_word(mlxcel::int8_pair<0x4341>(hi))};
                  mlxcel::Mma<TM>::run(acc[c + h], a, b0, b1);
                }
              }
            }
          }
        } else {

          // ---- 3a. scores ----
          float s[NT][4];
          if constexpr (QUANTIZED) {
            // ldmatrix over code rows gives lane (g, tig), from each 16-byte
            // unit m of token row g, its bytes 4 tig..4 tig + 3. int8: unit m
            // is k-step m, the 4 codes its pairs (b0, b1), exact; the token's
            // scale then multiplies its scores. int4: unit m is group m's 32
            // dims, the 8 codes two k-steps' pairs, dequantized with the
            // token's scale and zero of the group.
            constexpr int UNITS = ROW_BYTES / 16;
            constexpr int LOAD = UNITS < 4 ? UNITS : 4;
            #pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
              const int token = token0 + nt * 8;
              const unsigned char* key_row = key_codes + (token + (lane & 7)) * CODE_STRIDE + (lane >> 3) * 16;
              #pragma unroll
              for (int m0 = 0; m0 < UNITS; m0 += LOAD) {
                uint32_t w[LOAD];
                mlxcel::load_matrices(w, key_row + m0 * 16);
                #pragma unroll
                for (int i = 0; i < LOAD; ++i) {
                  const int m = m0 + i;
                  if constexpr (Format::AFFINE) {
                    // Scales and zeros of token + g, groups 2j and 2j + 1 in word j.
                    const uint32_t* scales_of =
                        reinterpret_cast<const uint32_t*>(scale_rows + (token + g) * SCALE_BYTES);
                    const uint32_t* zeros_of = scales_of + 2 * CHUNK * SCALE_BYTES / 4;
                    const __half2 sc = m & 1 ? __high2half2(mlxcel::as_half2(scales_of[m / 2]))
                                             : __low2half2(mlxcel::as_half2(scales_of[m / 2]));
                    const __half2 zero = m & 1 ? __high2half2(mlxcel::as_half2(zeros_of[m / 2]))
                                               : __low2half2(mlxcel::as_half2(zeros_of[m / 2]));
                    __half2 c[4];
                    mlxcel::nibble_pairs(w[i], c);
                    mlxcel::Mma<TM>::run(s[nt], qf[2 * m], mlxcel::as_word(__hfma2(c[0], sc, zero)),
                                         mlxcel::as_word(__hfma2(c[1], sc, zero)));
                    mlxcel::Mma<TM>::run(s[nt], qf[2 * m + 1], mlxcel::as_word(__hfma2(c[2], sc, zero)),
                                         mlxcel::as_word(__hfma2(c[3], sc, zero)));
                  } else {
                    const uint32_t flipped = w[i] ^ 0x80808080u;
                    mlxcel::Mma<TM>::run(s[nt], qf[m], mlxcel::as_word(mlxcel::int8_pair<0x4140>(flipped)),
                                         mlxcel::as_word(mlxcel::int8_pair<0x4342>(flipped)));
                  }
                }
              }
              if constexpr (!Format::AFFINE) {   // this lane's columns: tokens token + 2 tig (c even) and + 1
                const __half* key_scales = reinterpret_cast<const __half*>(scale_rows) + 2 * (token + 2 * tig);
                const float even = __half2float(key_scales[scale_half[0]]);
                const float odd = __half2float(key_scales[2 + scale_half[1]]);
                s[nt][0] *= even; s[nt][1] *= odd; s[nt][2] *= even; s[nt][3] *= odd;
              }
            }
          } else {
            #pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
              #pragma unroll
              for (int kk = 0; kk < DK; kk += 2) {
                uint32_t b[4];
                mlxcel::load_matrices(b, keys + (token0 + nt * 8 + (lane & 7)) * STRIDE + kk * 16 + (lane >> 3) * 8);
                mlxcel::Mma<T>::run(s[nt], qf[kk], b[0], b[1]);
                mlxcel::Mma<T>::run(s[nt], qf[kk + 1], b[2], b[3]);
              }
            }
          }

          // ---- 4. mask and online softmax ----
          if (slot0 < first_slot || slot0 + STEP > end_slot) {   // only a step at the row's ends (warp-uniform)
            #pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              #pragma unroll
              for (int c = 0; c < 4; ++c) {
                const int slot = slot0 + nt * 8 + tig * 2 + (c & 1);
                if (slot < first_slot || slot >= end_slot) s[nt][c] = neg_inf;
              }
            }
          }
          float step_max[2] = {neg_inf, neg_inf};
          #pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            #pragma unroll
            for (int c = 0; c < 4; ++c) step_max[c >> 1] = fmaxf(step_max[c >> 1], s[nt][c]);
          }
          float alpha[2];
          if (mlxcel::rebase(step_max, row_max, row_sum, alpha)) {
            #pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
              acc[dt][0] *= alpha[0]; acc[dt][1] *= alpha[0];
              acc[dt][2] *= alpha[1]; acc[dt][3] *= alpha[1];
            }
          }
          #pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            #pragma unroll
            for (int c = 0; c < 4; ++c) {
              const float base = row_max[c >> 1] == neg_inf ? 0.f : row_max[c >> 1];   // nothing valid yet: exp2 -> 0
              s[nt][c] = mlxcel::fast_exp2(s[nt][c] - base);
              row_sum[c >> 1] += s[nt][c];
            }
          }

          // ---- 3b. O += P V ----
          #pragma unroll
          for (int kt = 0; kt < NT / 2; ++kt) {
            const uint32_t a[4] = {
                mlxcel::Mma<TM>::pack(s[2 * kt][0], s[2 * kt][1]), mlxcel::Mma<TM>::pack(s[2 * kt][2], s[2 * kt][3]),
                mlxcel::Mma<TM>::pack(s[2 * kt + 1][0], s[2 * kt + 1][1]),
                mlxcel::Mma<TM>::pack(s[2 * kt + 1][2], s[2 * kt + 1][3])};
            if constexpr (QUANTIZED) {
              // ldmatrix.trans over code rows gives lane (g, tig), from each
              // 16-byte unit of the 16 tokens, the bytes 2g and 2g + 1 of tokens
              // 2 tig and 2 tig + 1 (b[0]; of tokens + 8 and + 9 in b[1]; the
              // next unit's in b[2], b[3]): the k pairs of several output
              // columns. int8: unit c's dims 16c + 2g + u (u = 0, 1) are column
              // g of output tile 2c + u; int4: dims 32c + 4g + u (u < 4) of tile
              // 4c + u (see 5). Values are dequantized with their tokens'
              // scales (and zeros of group c).
              const int pair = token0 + kt * 16 + 2 * tig;   // this lane's tokens: pair, + 1, + 8, + 9
              const unsigned char* value_row =
                  value_codes + (token0 + kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * CODE_STRIDE +
                  (lane >> 4) * 16;
              if constexpr (Format::AFFINE) {
                // Token t's scales (zeros): words j (groups 2j, 2j + 1) of row t.
                const uint32_t* scales_of = reinterpret_cast<const uint32_t*>(scale_rows + CHUNK * SCALE_BYTES);
                const uint32_t* zeros_of = scales_of + 2 * CHUNK * SCALE_BYTES / 4;
                constexpr int WORDS = SCALE_BYTES / 4;
                #pragma unroll
                for (int c = 0; c < ROW_BYTES / 16; c += 2) {
                  uint32_t b[4];
                  mlxcel::load_matrices_transposed(b, value_row + c * 16);
                  #pragma unroll
                  for (int h = 0; h < 2; ++h) {
                    // Group c + h's scales and zeros of (pair, pair + 1) and (pair + 8, pair + 9).
                    const int group_of = c + h;
                    const __half* sc = reinterpret_cast<const __half*>(scales_of) + group_of;
                    const __half* zr = reinterpret_cast<const __half*>(zeros_of) + group_of;
                    constexpr int ROW = 2 * WORDS;   // halves per token row
                    const __half2 sl = __halves2half2(sc[pair * ROW], sc[(pair + 1) * ROW]);
                    const __half2 sh = __halves2half2(sc[(pair + 8) * ROW], sc[(pair + 9) * ROW]);
                    const __half2 zl = __halves2half2(zr[pair * ROW], zr[(pair + 1) * ROW]);
                    const __half2 zh = __halves2half2(zr[(pair + 8) * ROW], zr[(pair + 9) * ROW]);
                    const int tile = 4 * (c + h);
                    __half2 lo[4], hi[4];
                    mlxcel::nibble_pairs(b[2 * h], lo);
                    mlxcel::nibble_pairs(b[2 * h + 1], hi);
                    #pragma unroll
                    for (int u = 0; u < 4; ++u) {
                      mlxcel::Mma<TM>::run(acc[tile + u], a, mlxcel::as_word(__hfma2(lo[u], sl, zl)),
                                           mlxcel::as_word(__hfma2(hi[u], sh, zh)));
                    }
                  }
                }
              } else {
                // Token t's scale: half scale_half[t % 2] of word t (see stage()).
                const __half* scales_of = reinterpret_cast<const __half*>(scale_rows + CHUNK * SCALE_BYTES) + 2 * pair;
                const __half2 sl = __halves2half2(scales_of[scale_half[0]], scales_of[2 + scale_half[1]]);
                const __half2 sh = __halves2half2(scales_of[16 + scale_half[0]], scales_of[18 + scale_half[1]]);
                #pragma unroll
                for (int c = 0; c < ROW_BYTES / 16; c += 2) {
                  uint32_t b[4];
                  mlxcel::load_matrices_transposed(b, value_row + c * 16);
                  #pragma unroll
                  for (int h = 0; h < 2; ++h) {
                    const uint32_t lo = b[2 * h] ^ 0x80808080u, hi = b[2 * h + 1] ^ 0x80808080u;
                    const int tile = 2 * (c + h);
                    mlxcel::Mma<TM>::run(acc[tile], a, mlxcel::as_word(__hmul2(mlxcel::int8_pair<0x4240>(lo), sl)),
                                         mlxcel::as_word(__hmul2(mlxcel::int8_pair<0x4240>(hi), sh)));
                    mlxcel::Mma<TM>::run(acc[tile + 1], a, mlxcel::as_word(__hmul2(mlxcel::int8_pair<0x4341>(lo), sl)),
                                         mlxcel::as_word(__hmul2(mlxcel::int8_pair<0x4341>(hi), sh)));
                  }
                }
              }
            } else {
              #pragma unroll
              for (int dt = 0; dt < DT; dt += 2) {
                uint32_t b[4];
                mlxcel::load_matrices_transposed(
                    b, values + (token0 + kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + dt * 8 +
                           (lane >> 4) * 8);
                mlxcel::Mma<T>::run(acc[dt], a, b[0], b[1]);
                mlxcel::Mma<T>::run(acc[dt + 1], a, b[2], b[3]);
              }
            }
          }
        }
      }
    }
    buffer = buffer + 1 == STAGES ? 0 : buffer + 1;
  }
  __syncthreads();                                 // the states below reuse the staging memory

  // ---- 5. merge the token-splitting warps, write ----
  float* warp_acc = reinterpret_cast<float*>(mlxcel_shared);   // [WARPS][16][D]
  float* warp_max = warp_acc + WARPS * 16 * D;                  // [WARPS][16]
  float* warp_sum = warp_max + WARPS * 16;                      // [WARPS][16]
  if (active && HEADS_ON_N) {   // heads 2 tig, 2 tig + 1; tile u's rows g, g + 8: two dims in a row (3b)
    #pragma unroll
    for (int j = 0; j < 2; ++j) {
      row_sum[j] = mlxcel::lane_sum(mlxcel::lane_sum(mlxcel::lane_sum(row_sum[j], 4), 8), 16);
      if (g == 0) {
        warp_max[warp * 16 + 2 * tig + j] = row_max[j];
        warp_sum[warp * 16 + 2 * tig + j] = row_sum[j];
      }
      constexpr float unlift = Format::AFFINE ? 1.f : 1.f / VALUE_LIFT;   // exact: a power of two
      #pragma unroll
      for (int u = 0; u < ACC_TILES; ++u) {
        const int dim = Format::AFFINE ? 32 * (u >> 1) + 4 * g + 2 * (u & 1) : 16 * u + 2 * g;
        *reinterpret_cast<float2*>(warp_acc + (warp * 16 + 2 * tig + j) * D + dim) =
            make_float2(acc[u][j] * unlift, acc[u][2 + j] * unlift);
      }
    }
  } else if (active) {
    #pragma unroll
    for (int r = 0; r < 2; ++r) row_sum[r] = mlxcel::lane_sum(mlxcel::lane_sum(row_sum[r], 1), 2);
    if (tig == 0) {
      warp_max[warp * 16 + g] = row_max[0];
      warp_max[warp * 16 + g + 8] = row_max[1];
      warp_sum[warp * 16 + g] = row_sum[0];
      warp_sum[warp * 16 + g + 8] = row_sum[1];
    }
    #pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      // This lane's columns of tile dt: dims dim and dim + NEXT (quantized
      // pages: the column order 3b read the values in).
      constexpr int NEXT = !QUANTIZED ? 1 : Format::AFFINE ? 4 : 2;
      const int dim = !QUANTIZED ? dt * 8 + tig * 2
                      : Format::AFFINE ? 32 * (dt >> 2) + 8 * tig + (dt & 3) : 16 * (dt >> 1) + 4 * tig + (dt & 1);
      float* top_row = warp_acc + (warp * 16 + g) * D + dim;
      top_row[0] = acc[dt][0];
      top_row[NEXT] = acc[dt][1];
      top_row[8 * D] = acc[dt][2];
      top_row[8 * D + NEXT] = acc[dt][3];
    }
  }
  __syncthreads();
  // Per row: the split warps' weights, each divided by the row's total once,
  // and the row's lse; then the rows' D floats, four at a time.
  float* split_scale = warp_sum + WARPS * 16;                   // [WARPS][16]
  for (int i = threadIdx.x; i < WM * TILE_HEADS; i += THREADS) {
    const int wm = i / TILE_HEADS, r = i % TILE_HEADS;
    float top = neg_inf;
    #pragma unroll
    for (int j = 0; j < SPLIT; ++j) top = fmaxf(top, warp_max[(j * WM + wm) * 16 + r]);
    float weight[SPLIT], total = 0.f;
    #pragma unroll
    for (int j = 0; j < SPLIT; ++j) {
      const int w = (j * WM + wm) * 16 + r;
      weight[j] = top == neg_inf ? 0.f : exp2f(warp_max[w] - top);
      total += weight[j] * warp_sum[w];
    }
    const float inverse = total > 0.f ? 1.f / total : 0.f;
    #pragma unroll
    for (int j = 0; j < SPLIT; ++j) split_scale[(j * WM + wm) * 16 + r] = weight[j] * inverse;
    const int head = (group * WM + wm) * 16 + r;
    const float lse = total > 0.f ? top + log2f(total) : neg_inf;
    if constexpr (MERGE_DEPTHS > 0) {
      warp_max[i] = lse;                           // the first split warp's slot, read above by this thread alone
    } else if (head < heads) {
      out_lse[size_t(tile) * out_heads + kv_head * heads + head] = lse;
    }
  }
  __syncthreads();
  constexpr int QUADS = D / 4;
  for (int i = threadIdx.x; i < WM * 16 * QUADS; i += THREADS) {
    const int wm = i / (16 * QUADS), r = (i / QUADS) % 16, quad = i % QUADS;
    const int head = (group * WM + wm) * 16 + r;
    if (head >= heads) continue;
    float4 value = make_float4(0.f, 0.f, 0.f, 0.f);
    #pragma unroll
    for (int j = 0; j < SPLIT; ++j) {
      const int w = (j * WM + wm) * 16 + r;
      const float scale_j = split_scale[w];
      const float4 x = reinterpret_cast<const float4*>(warp_acc + w * D)[quad];
      value.x += scale_j * x.x; value.y += scale_j * x.y; value.z += scale_j * x.z; value.w += scale_j * x.w;
    }
    if constexpr (MERGE_DEPTHS > 0) {         // into the first split warp's row (read above by this thread alone)
      reinterpret_cast<float4*>(warp_acc + (wm * 16 + r) * D)[quad] = value;
    } else {
      const size_t out_row = size_t(tile) * out_heads + kv_head * heads + head;
      reinterpret_cast<float4*>(out + out_row * D)[quad] = value;
    }
  }

  // A cascade's private level of a tile a row, merged: each head's state,
  // now in shared memory, folded with the levels' states of the row's head
  // (the cascade merge's fold, a warp a head), written in the output dtype.
  if constexpr (MERGE_DEPTHS > 0) {
    __syncthreads();
    constexpr int VEC = D / 32;
    const float* level_o[4] = {o0, o1, o2, o3};
    const float* level_lse[4] = {lse0, lse1, lse2, lse3};
    const int level_heads[4] = {o0_shape[1], o1_shape[1], o2_shape[1], o3_shape[1]};
    for (int h = warp; h < heads; h += WARPS) {
      const int head = kv_head * group_size + h;
      float top, total, value[VEC];
      mlxcel::fold_cascade<VEC, MERGE_DEPTHS, MEMBER_IS_ROW>(
          row, head, q_heads, group_size, 1, [&](int) { return warp_max + h; }, [&](int) { return warp_acc + h * D; },
          level_o, level_lse, level_heads, o0_shape[0], level_map, lane, top, total, value);
      TO* dst = merged + (size_t(row) * q_heads + head) * D + lane * VEC;
      #pragma unroll
      for (int k = 0; k < VEC; ++k) dst[k] = static_cast<TO>(total > 0.f ? value[k] / total : 0.f);
    }
  }
"""

MERGE_SOURCE = r"""
  constexpr int VEC = D / 32;                       // contiguous floats per lane
  const float neg_inf = -mlxcel::infinity();
  const int heads = v_in_shape[1];
  const int groups = indptr_shape[0] - 1;
  const size_t item = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (item >= size_t(groups) * heads) return;      // whole warps leave together
  const int group = item / heads, head = item % heads;
  const int begin = indptr[group], end = indptr[group + 1];

  float top, total, value[VEC];
  mlxcel::fold_states(
      end - begin, [&](int i) { return static_cast<float>(lse_in[size_t(begin + i) * heads + head]); },
      [&](int i) { return v_in + (size_t(begin + i) * heads + head) * D + lane * VEC; },
      top, total, value);
  float* dst = out + item * D + lane * VEC;
  #pragma unroll
  for (int k = 0; k < VEC; ++k) dst[k] = total > 0.f ? value[k] / total : 0.f;
  if (lane == 0) out_lse[item] = total > 0.f ? top + log2f(total) : neg_inf;
"""


CASCADE_MERGE_SOURCE = r"""
  constexpr int VEC = D / 32;                       // contiguous floats per lane
  const int rows = indptrp_shape[0] - 1;
  const int q_heads = op_shape[1];
  const size_t item = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (item >= size_t(rows) * q_heads) return;      // whole warps leave together
  const int row = item / q_heads, head = item % q_heads;
  // The common layouts need no lookup before the states' loads (one round
  // trip fewer): one span, every row a member, member m being row m
  // (MEMBER_IS_ROW), and one private state per row, state r being row r's
  // (PRIVATE_ONE).
  const int begin = PRIVATE_ONE ? row : indptrp[row];
  const int private_states = PRIVATE_ONE ? 1 : indptrp[row + 1] - begin;
  const float* level_o[4] = {o0, o1, o2, o3};
  const float* level_lse[4] = {lse0, lse1, lse2, lse3};
  const int level_heads[4] = {o0_shape[1], o1_shape[1], o2_shape[1], o3_shape[1]};
  float top, total, value[VEC];
  mlxcel::fold_cascade<VEC, DEPTHS, MEMBER_IS_ROW>(
      row, head, q_heads, G, private_states, [&](int i) { return lsep + size_t(begin + i) * q_heads + head; },
      [&](int i) { return op + (size_t(begin + i) * q_heads + head) * D; }, level_o, level_lse, level_heads,
      o0_shape[0], level_map, lane, top, total, value);
  TO* dst = out + item * D + lane * VEC;
  #pragma unroll
  for (int k = 0; k < VEC; ++k) dst[k] = static_cast<TO>(total > 0.f ? value[k] / total : 0.f);
"""


# The kernels as device functions around the bodies above (verbatim): a
# launch passes MLX's parameters through, shapes included, by the same names.
# MERGE_DEPTHS > 0: a cascade's private level of one tile a row, its output
# folded with the levels' states o0..o3 (the cascade merge's inputs) into merged.
PARTIAL_SIGNATURE = (
    "template <typename T, typename TQ, int D, int BLOCK, int WM, bool STACKED, bool HEADS_ON_N, int WARPS, int CHUNK,"
    " int STAGES, int SCALE_BITS, int MERGE_DEPTHS, bool MEMBER_IS_ROW, typename TO, typename S>\n__device__ __forceinline__"
    " void partial(const TQ* q, const S& q_shape,"
    " const T* k_pool, const S& k_pool_shape, const T* v_pool, const __half* k_scales, const __half* v_scales,"
    " const __half* k_zeros, const __half* v_zeros, const int32_t* indices, const int32_t* last_page_len,"
    " const int32_t* tiles, const int32_t* members, const S& members_shape, float* out, float* out_lse,"
    " const float* o0, const S& o0_shape, const float* lse0, const float* o1, const S& o1_shape, const float* lse1,"
    " const float* o2, const S& o2_shape, const float* lse2, const float* o3, const S& o3_shape, const float* lse3,"
    " const int32_t* level_map, TO* merged)")
MERGE_SIGNATURE = (
    "template <typename TV, typename TL, int D, typename S>\n__device__ __forceinline__ void merge(const TV* v_in,"
    " const S& v_in_shape, const TL* lse_in, const int32_t* indptr, const S& indptr_shape, float* out,"
    " float* out_lse)")
CASCADE_MERGE_SIGNATURE = (
    "template <typename TO, int D, int G, int DEPTHS, bool MEMBER_IS_ROW, bool PRIVATE_ONE, typename S>\n"
    "__device__ __forceinline__ void cascade_merge(const float* op, const S& op_shape, const float* lsep,"
    " const int32_t* indptrp, const S& indptrp_shape, const float* o0, const S& o0_shape, const float* lse0,"
    " const float* o1, const S& o1_shape, const float* lse1, const float* o2, const S& o2_shape,"
    " const float* lse2, const float* o3, const S& o3_shape, const float* lse3, const int32_t* level_map,"
    " TO* out)")
# The partial kernel writing states (no merge), as the launches call it.
PARTIAL_STATES = r"""namespace mlxcel {
template <typename T, typename TQ, int D, int BLOCK, int WM, bool STACKED, bool HEADS_ON_N, int WARPS, int CHUNK,
          int STAGES, int SCALE_BITS, typename S>
__device__ __forceinline__ void partial_states(const TQ* q, const S& q_shape, const T* k_pool, const S& k_pool_shape,
    const T* v_pool, const __half* k_scales, const __half* v_scales, const __half* k_zeros, const __half* v_zeros,
    const int32_t* indices, const int32_t* last_page_len, const int32_t* tiles, const int32_t* members,
    const S& members_shape, float* out, float* out_lse) {
  partial<T, TQ, D, BLOCK, WM, STACKED, HEADS_ON_N, WARPS, CHUNK, STAGES, SCALE_BITS, 0, false, float>(
      q, q_shape, k_pool, k_pool_shape, v_pool, k_scales, v_scales, k_zeros, v_zeros, indices, last_page_len, tiles,
      members, members_shape, out, out_lse, nullptr, q_shape, nullptr, nullptr, q_shape, nullptr, nullptr, q_shape,
      nullptr, nullptr, q_shape, nullptr, nullptr, static_cast<float*>(nullptr));
}
}  // namespace mlxcel
"""
LIBRARY = HEADER + WARPGROUP_HEADER + "".join(
    f"namespace mlxcel {{\n{signature} {{\n{body}}}\n}}  // namespace mlxcel\n"
    for signature, body in ((PARTIAL_SIGNATURE, PARTIAL_SOURCE), (MERGE_SIGNATURE, MERGE_SOURCE),
                            (CASCADE_MERGE_SIGNATURE, CASCADE_MERGE_SOURCE),
                            (WARPGROUP_PARTIAL_SIGNATURE, WARPGROUP_PARTIAL_SOURCE))) + PARTIAL_STATES

PARTIAL_TEMPLATE = "T, TQ, D, BLOCK, WM, STACKED, HEADS_ON_N, WARPS, CHUNK, STAGES, SCALE_BITS"
PARTIAL_CALL = (f"mlxcel::partial_states<{PARTIAL_TEMPLATE}>(q, q_shape, k_pool, k_pool_shape, v_pool, nullptr, "
                "nullptr, nullptr, nullptr, indices, last_page_len, tiles, members, members_shape, out, out_lse);")
# Quantized pages: the codes as k_pool / v_pool, their scales and zeros (int8: a placeholder) beside them.
QUANTIZED_PARTIAL_CALL = (f"mlxcel::partial_states<{PARTIAL_TEMPLATE}>(q, q_shape, k_pool, k_pool_shape, v_pool, "
                          "k_scales, v_scales, k_zeros, v_zeros, indices, last_page_len, tiles, members, "
                          "members_shape, out, out_lse);")
MERGED = "o0, o0_shape, lse0, o1, o1_shape, lse1, o2, o2_shape, lse2, o3, o3_shape, lse3, level_map, out"
MERGED_TEMPLATE = "T, TQ, D, BLOCK, WM, false, HEADS_ON_N, WARPS, CHUNK, STAGES, SCALE_BITS, DEPTHS, MEMBER_IS_ROW, TO"
# A cascade's private level with its merge (MERGE_DEPTHS levels), float and quantized pages.
MERGED_PARTIAL_CALL = (f"mlxcel::partial<{MERGED_TEMPLATE}>(q, q_shape, k_pool, k_pool_shape, v_pool, nullptr, "
                       "nullptr, nullptr, nullptr, indices, last_page_len, tiles, members, members_shape, nullptr, "
                       f"nullptr, {MERGED});")
MERGED_QUANTIZED_PARTIAL_CALL = (f"mlxcel::partial<{MERGED_TEMPLATE}>(q, q_shape, k_pool, k_pool_shape, v_pool, "
                                 "k_scales, v_scales, k_zeros, v_zeros, indices, last_page_len, tiles, members, "
                                 f"members_shape, nullptr, nullptr, {MERGED});")
MERGE_CALL = "mlxcel::merge<TV, TL, D>(v_in, v_in_shape, lse_in, indptr, indptr_shape, out, out_lse);"
CASCADE_MERGE_CALL = ("mlxcel::cascade_merge<TO, D, G, DEPTHS, MEMBER_IS_ROW, PRIVATE_ONE>(op, op_shape, lsep, "
                      "indptrp, indptrp_shape, o0, o0_shape, lse0, o1, o1_shape, lse1, o2, o2_shape, lse2, o3, "
                      "o3_shape, lse3, level_map, out);")


def library_folders() -> list[Path]:
    """Where the library file may live, in order: the user's cache (kept for
    as long as a server runs: NVRTC reads the file again for every new
    template instantiation, and temp cleaners remove old files), else the
    temp directory."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return [cache / "mlxcel" / "kernels", Path(tempfile.gettempdir()) / f"mlxcel-kernels-{os.getuid()}"]


def library_file(text: str) -> Path:
    """The library's text in a file named by its digest (written once, atomically)."""
    name = f"library-{hashlib.sha1(text.encode()).hexdigest()[:16]}.cuh"
    for folder in library_folders():
        path = folder / name
        try:
            if not path.exists():
                folder.mkdir(parents=True, exist_ok=True)
                staging = path.with_suffix(f".{os.getpid()}.tmp")
                staging.write_text(text)
                os.replace(staging, path)
            return path
        except OSError as error:
            failure = error
    raise RuntimeError(f"cannot write the CUDA kernel library to {name} in any of "
                       f"{[str(f) for f in library_folders()]}: {failure}")


@functools.cache   # a model has a few such constants, asked for by every layer of every step
def float_bits(value: float) -> int:
    """A float32 as a template int (the kernels read it back with __int_as_float)."""
    return struct.unpack("<i", struct.pack("<f", float(value)))[0]


def make_kernel(name: str, inputs: list, outputs: list, source: str, header: str, shared_bytes: int):
    # NVRTC opens an absolute include path itself; the kernel's name carries
    # the library's digest (fused._kernel), so an edited library never meets
    # a stale binary.
    return mx.fast.cuda_kernel(name=name, input_names=inputs, output_names=outputs, source=source,
                               header=f'#include "{library_file(header)}"\n', shared_memory=shared_bytes)


# 4 warps x 64-token chunks, double-buffered: 68 KB of staging at D=128 (int8
# codes 37 KB, int4 24 KB; either's states after the loop 33 KB), three
# blocks per SM (<= 168 registers a lane allow three as well; the uncapped
# level-0 layout with 4 head-splitting warps, run only by sweeps, takes 176: two
# such blocks per SM, see tests/test_fused_sources.py).
@functools.cache
def hopper() -> bool:
    """Whether the device runs warpgroup MMA (compute capability 9.x; MLX compiles for sm_90a there)."""
    return mx.device_info().get("compute_capability_major") == 9


KERNELS = FusedKernels(Platform("cuda", LIBRARY, PARTIAL_CALL, MERGE_CALL, CASCADE_MERGE_CALL, make_kernel,
                                warps=4, chunk_tokens=64, stages=2, quantized_partial_source=QUANTIZED_PARTIAL_CALL,
                                merged_partial_source=MERGED_PARTIAL_CALL,
                                merged_quantized_partial_source=MERGED_QUANTIZED_PARTIAL_CALL,
                                warpgroup_partial_source=WARPGROUP_PARTIAL_CALL,
                                warpgroup_quantized_partial_source=WARPGROUP_QUANTIZED_PARTIAL_CALL,
                                warpgroup_device=hopper, transposes=True))


# The backend API (kernels/__init__.py dispatches to these names).
paged_attention_partial = KERNELS.paged_attention_partial
prepare_partial = KERNELS.prepare_partial
merge_states = KERNELS.merge_states
prepare_merge = KERNELS.prepare_merge
takes = KERNELS.takes  # whether prepare_cascade runs this shape (else the generic two-level path)
prepare_cascade = KERNELS.prepare_cascade
cascade_decode = KERNELS.cascade_decode
