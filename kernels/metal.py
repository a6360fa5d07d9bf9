"""Fused paged attention for MLX's Metal backend (``mx.fast.metal_kernel``).

The Metal spelling of the kernels in ``cuda.py``, section by section in the
same order (constants and coordinates; 1. Q fragments; 2. staging; 3a.
scores; 4. mask and online softmax; 3b. O += P V; 5. merge the warps, write;
the merge kernel; the cascade merge kernel). The host side is the shared ``fused`` module. What
differs, and why:

- matrix units: 8x8 float ``simdgroup_matrix`` products instead of mma.sync
  m16n8k16; a warp's 16 heads are two 8-row tiles. A thread holds elements
  (fm, fn) and (fm, fn+1) of each 8x8 tile, so a row's lanes differ in lane
  bits 0 and 3 (shuffles xor 1 and 8, where CUDA's differ in bits 0 and 1);
- staging: plain 16-byte loads into threadgroup memory (Metal has no
  cp.async), one stage;
- quantized pages: codes and scales are staged as the pool holds them (as
  on CUDA) and each element is dequantized as the fragment reads it, to a
  float (the simdgroup matrices are float: nothing is rounded to 16 bits);
  one body serves every format through ``Pages`` (Metal has no ``if
  constexpr``), a float pool's kernel binding no scales;
- merges: one plain loop over the states (CUDA's fold_states issues a batch
  of states' loads before using any, through lambdas, which Metal lacks);
- sizes: threadgroup memory is 32 KB on Apple GPUs, so 2 simdgroups and
  32-token chunks (17 KB of staging at D=128, reused for the states).

No Metal GPU was available to this project: these kernels have never run.
They are not chosen by default on Apple GPUs (the portable kernels are);
``MLXCEL_KERNELS=fused`` selects them for a first run against the tests.
"""

from __future__ import annotations

import mlx.core as mx

from .fused import MAX_DEPTH, FusedKernels, Platform  # noqa: F401  (MAX_DEPTH: the backend API)

HEADER = r"""
#include <metal_simdgroup_matrix>

namespace mlxcel {

// (fn, fm): column and row of this lane's two elements (fn, fn+1) in an 8x8 simdgroup matrix.
inline short2 frag_coord(ushort lane) {
  const short qid = lane / 4;
  return short2((qid & 2) * 2 + (lane % 2) * 2, (qid & 4) + ((lane / 2) % 4));
}

inline float lane_max(float x, ushort mask) {
  return metal::max(x, metal::simd_shuffle_xor(x, mask));
}

inline float lane_sum(float x, ushort mask) {
  return x + metal::simd_shuffle_xor(x, mask);
}

// A quantized pool's scales and zeros (a float pool's kernel: none).
struct Scales {
  const device half* k_scales;
  const device half* v_scales;
  const device half* k_zeros;
  const device half* v_zeros;
};

// How the partial kernel stages and reads one page format (kv_quant has
// them): a token row of one KV head is ROW_BYTES of elements or codes; a
// quantized token's scales (and zeros) take SCALE_BYTES of a row of their own.
template <typename T, int D> struct Pages {           // bfloat16 / float16 elements
  static constant constexpr const int ROW_BYTES = D * 2;
  static constant constexpr const int SCALE_BYTES = 0;
  static void stage_scales(threadgroup uchar*, const device half*, const device half*, size_t, bool) {}
  static float read(threadgroup const uchar* row, threadgroup const uchar*, int dim) {
    return static_cast<float>(reinterpret_cast<threadgroup const T*>(row)[dim]);
  }
};

template <int D> struct Pages<int8_t, D> {            // code * scale, one scale per token and KV head
  static constant constexpr const int ROW_BYTES = D;
  static constant constexpr const int SCALE_BYTES = 2;
  static void stage_scales(threadgroup uchar* dst, const device half* scales, const device half*, size_t at,
                           bool valid) {
    *reinterpret_cast<threadgroup half*>(dst) = valid ? scales[at] : half(0);
  }
  static float read(threadgroup const uchar* row, threadgroup const uchar* scale, int dim) {
    return float(reinterpret_cast<threadgroup const int8_t*>(row)[dim]) *
           float(*reinterpret_cast<threadgroup const half*>(scale));
  }
};

template <int D> struct Pages<uint8_t, D> {           // code * scale + zero per 32 channels, two codes a byte
  static constant constexpr const int GROUPS = D / 32;
  static constant constexpr const int ROW_BYTES = D / 2;
  static constant constexpr const int SCALE_BYTES = GROUPS * 4;   // the scales, then the zeros
  static void stage_scales(threadgroup uchar* dst, const device half* scales, const device half* zeros, size_t at,
                           bool valid) {
    threadgroup half* out = reinterpret_cast<threadgroup half*>(dst);
    for (int g = 0; g < GROUPS; ++g) {
      out[g] = valid ? scales[at * GROUPS + g] : half(0);
      out[GROUPS + g] = valid ? zeros[at * GROUPS + g] : half(0);
    }
  }
  static float read(threadgroup const uchar* row, threadgroup const uchar* scale, int dim) {
    const uchar pair = row[dim / 2];                           // channel 2i low nibble, 2i + 1 high
    threadgroup const half* of = reinterpret_cast<threadgroup const half*>(scale);
    return float(dim & 1 ? pair >> 4 : pair & 15) * float(of[dim / 32]) + float(of[GROUPS + dim / 32]);
  }
};

}  // namespace mlxcel
"""

PARTIAL_SOURCE = r"""
  // ---- constants and coordinates ----
  using Format = mlxcel::Pages<T, D>;
  constexpr int THREADS = WARPS * 32;
  constexpr int SPLIT = WARPS / WM;                 // warps sharing one 16-head tile, splitting tokens
  constexpr int WARP_TOKENS = CHUNK / SPLIT;        // tokens of each chunk one warp reads
  constexpr int STEP = WARP_TOKENS < 32 ? WARP_TOKENS : 32;
  constexpr int NT = STEP / 8;                      // score tiles (8 tokens) per step
  constexpr int DK = D / 8;                         // k-steps of Q K^T
  constexpr int DT = D / 8;                         // output tiles (8 dims)
  constexpr int STRIDE = Format::ROW_BYTES + 16;    // padded threadgroup row, bytes
  constexpr int VECS = Format::ROW_BYTES / 16;      // 16-byte vectors per token row
  constexpr int STAGE = CHUNK * STRIDE;
  constexpr int SCALE_ROWS = CHUNK * Format::SCALE_BYTES;
  constexpr int STAGED_WORDS = (2 * STAGE + 2 * SCALE_ROWS) / 4;   // K and V rows of one stage, their scales
  constexpr int STATE_WORDS = WARPS * 16 * (D + 3);   // accumulators, max, sum, merge weight
  constexpr int SHARED_WORDS = STAGED_WORDS > STATE_WORDS ? STAGED_WORDS : STATE_WORDS;
  constexpr float RESCALE_SLACK = 8.f;              // log2 units
  const float scale = as_type<float>(SCALE_BITS);
  const float neg_inf = -INFINITY;

  const int kv_heads = k_pool_shape[2];
  const int q_heads = q_shape[1];
  const int group_size = q_heads / kv_heads;        // G: the model's query heads per KV head
  // Query heads of this KV head: G, or M * G when STACKED (a cascade level,
  // a row per span, members [spans, M]: member m's head kv * G + g is stacked
  // head kv * (M * G) + m * G + g; a narrower span's padding repeats a member).
  const int heads = STACKED ? members_shape[1] * group_size : group_size;
  const int out_heads = kv_heads * heads;
  const int groups = ((heads + 15) / 16 + WM - 1) / WM;
  const int tile = threadgroup_position_in_grid.x / groups;
  const int group = threadgroup_position_in_grid.x % groups;
  const int kv_head = threadgroup_position_in_grid.y;
  const int lid = thread_index_in_threadgroup;   // (`thread` is an address space in Metal)
  const int warp = simdgroup_index_in_threadgroup, lane = thread_index_in_simdgroup;
  const int warp_m = warp % WM, warp_t = warp / WM;
  const short2 coord = mlxcel::frag_coord(lane);
  const int fn = coord.x, fm = coord.y;
  const int head0 = (group * WM + warp_m) * 16;     // this warp's first head within the KV head
  const bool active = head0 < heads;

  const device int* geometry = tiles + 5 * tile;
  const int row = geometry[0], page_begin = geometry[1], page_count = geometry[2];
  const int first_slot = geometry[3];
  const int end_slot = page_count * BLOCK - (geometry[4] ? BLOCK - last_page_len[row] : 0);

  threadgroup float mlxcel_shared[SHARED_WORDS];
  // [K, V][CHUNK][STRIDE] bytes, then [K, V][CHUNK][SCALE_BYTES]
  threadgroup uchar* staged = reinterpret_cast<threadgroup uchar*>(mlxcel_shared);

  // ---- 1. Q fragments (rows fm and 8+fm, cols fn and fn+1 of each 8-dim k-step) ----
  simdgroup_matrix<float, 8, 8> qf[2][DK];
  for (int kk = 0; kk < DK; ++kk) {
    for (int mi = 0; mi < 2; ++mi) {
      // Every lane loads (a real head's address), rows past the heads become zeros.
      const int head = head0 + mi * 8 + fm;
      const int real = metal::min(head, heads - 1);
      const int q_row = STACKED ? members[row * members_shape[1] + real / group_size] : row;
      const int q_head = kv_head * group_size + real % group_size;
      for (int e = 0; e < 2; ++e) {
        const int d = kk * 8 + fn + e;
        const float x = static_cast<float>(q[(size_t(q_row) * q_heads + q_head) * D + d]) * scale;
        qf[mi][kk].thread_elements()[e] = head < heads ? x : 0.f;
      }
    }
  }

  simdgroup_matrix<float, 8, 8> acc[2][DT];
  for (int dt = 0; dt < DT; ++dt) acc[0][dt] = acc[1][dt] = make_filled_simdgroup_matrix<float, 8, 8>(0.f);
  float row_max[2] = {neg_inf, neg_inf};           // rows fm, 8+fm; log2 domain
  float row_sum[2] = {0.f, 0.f};                   // this lane's share until the final reduction

  constexpr int PASS_ROWS = THREADS / VECS;         // token rows one pass of the threadgroup copies
  // A chunk of whole pages whose passes never straddle a page: each pass's
  // page and row within it are compile-time functions of the pass, so one
  // lookup serves all the passes of a page.
  constexpr bool ALIGNED = CHUNK % BLOCK == 0 && BLOCK % PASS_ROWS == 0;
  constexpr int LOOKUPS = ALIGNED ? CHUNK / BLOCK : CHUNK / PASS_ROWS;
  const int pass_row = lid / VECS, part = lid % VECS;
  const size_t page_rows = size_t(BLOCK) * kv_heads;   // (token, KV head) rows of a page
  const int chunk_begin = first_slot / CHUNK;
  const int chunk_end = (end_slot + CHUNK - 1) / CHUNK;
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    // ---- 2. staging ----
    threadgroup uchar* keys = staged;
    threadgroup uchar* values = keys + STAGE;
    threadgroup uchar* key_scales = values + STAGE;
    threadgroup uchar* value_scales = key_scales + SCALE_ROWS;
    // The chunk's page lookups first; 64-bit arithmetic only for a page's base.
    size_t page_base[LOOKUPS];
    for (int p = 0; p < LOOKUPS; ++p) {
      const int page = ALIGNED ? chunk * (CHUNK / BLOCK) + p : (chunk * CHUNK + p * PASS_ROWS + pass_row) / BLOCK;
      page_base[p] = size_t(indices[page_begin + metal::min(page, page_count - 1)]) * page_rows;
    }
    for (int j = 0; j < CHUNK / PASS_ROWS; ++j) {
      const int slot_in_chunk = j * PASS_ROWS + pass_row;
      const int slot = chunk * CHUNK + slot_in_chunk;
      // Invalid slots are zeros (read from a valid slot's page, then dropped).
      const bool valid = slot >= first_slot && slot < end_slot;
      const int page_row = ALIGNED ? j * PASS_ROWS % BLOCK + pass_row : slot % BLOCK;
      const size_t at = page_base[ALIGNED ? j * PASS_ROWS / BLOCK : j] + (page_row * kv_heads + kv_head);
      const size_t byte = at * Format::ROW_BYTES + part * 16;
      const uint4 zero = uint4(0);
      *reinterpret_cast<threadgroup uint4*>(keys + slot_in_chunk * STRIDE + part * 16) =
          valid ? *reinterpret_cast<const device uint4*>(reinterpret_cast<const device uchar*>(k_pool) + byte) : zero;
      *reinterpret_cast<threadgroup uint4*>(values + slot_in_chunk * STRIDE + part * 16) =
          valid ? *reinterpret_cast<const device uint4*>(reinterpret_cast<const device uchar*>(v_pool) + byte) : zero;
      if (part == 0) {   // a quantized row's scales (and zeros) with its first vector
        Format::stage_scales(key_scales + slot_in_chunk * Format::SCALE_BYTES, scales.k_scales, scales.k_zeros, at,
                             valid);
        Format::stage_scales(value_scales + slot_in_chunk * Format::SCALE_BYTES, scales.v_scales, scales.v_zeros, at,
                             valid);
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (active) {
      for (int step = 0; step < WARP_TOKENS / STEP; ++step) {
        const int token0 = warp_t * WARP_TOKENS + step * STEP;

        // ---- 3a. scores ----
        simdgroup_matrix<float, 8, 8> s[2][NT];
        for (int nt = 0; nt < NT; ++nt) {
          s[0][nt] = s[1][nt] = make_filled_simdgroup_matrix<float, 8, 8>(0.f);
          for (int kk = 0; kk < DK; ++kk) {
            simdgroup_matrix<float, 8, 8> kt;      // K^T tile: (dim fm, token fn + e)
            for (int e = 0; e < 2; ++e) {
              const int token = token0 + nt * 8 + fn + e;
              kt.thread_elements()[e] = Format::read(keys + token * STRIDE, key_scales + token * Format::SCALE_BYTES,
                                                     kk * 8 + fm);
            }
            simdgroup_multiply_accumulate(s[0][nt], qf[0][kk], kt, s[0][nt]);
            simdgroup_multiply_accumulate(s[1][nt], qf[1][kk], kt, s[1][nt]);
          }
        }

        // ---- 4. mask and online softmax ----
        const int slot0 = chunk * CHUNK + token0;
        if (slot0 < first_slot || slot0 + STEP > end_slot) {   // only a step at the row's ends (simdgroup-uniform)
          for (int nt = 0; nt < NT; ++nt) {
            for (int mi = 0; mi < 2; ++mi) {
              for (int e = 0; e < 2; ++e) {
                const int slot = slot0 + nt * 8 + fn + e;
                if (slot < first_slot || slot >= end_slot) s[mi][nt].thread_elements()[e] = neg_inf;
              }
            }
          }
        }
        float step_max[2] = {neg_inf, neg_inf};
        for (int nt = 0; nt < NT; ++nt) {
          for (int mi = 0; mi < 2; ++mi) {
            for (int e = 0; e < 2; ++e) step_max[mi] = metal::max(step_max[mi], float(s[mi][nt].thread_elements()[e]));
          }
        }
        // The exponent base (row_max) moves only when a row's scores outgrow
        // it by 2^RESCALE_SLACK, for the whole simdgroup at once (see cuda.py).
        float top[2];
        bool grow = false;
        for (int r = 0; r < 2; ++r) {
          top[r] = mlxcel::lane_max(mlxcel::lane_max(step_max[r], 1), 8);
          grow |= top[r] > row_max[r] + RESCALE_SLACK;
        }
        if (metal::simd_any(grow)) {
          float alpha[2];
          for (int r = 0; r < 2; ++r) {
            const float moved = metal::max(row_max[r], top[r]);
            alpha[r] = moved == neg_inf ? 1.f : metal::exp2(row_max[r] - moved);
            row_max[r] = moved;
            row_sum[r] *= alpha[r];
          }
          for (int dt = 0; dt < DT; ++dt) {
            for (int mi = 0; mi < 2; ++mi) {
              acc[mi][dt].thread_elements()[0] *= alpha[mi];
              acc[mi][dt].thread_elements()[1] *= alpha[mi];
            }
          }
        }
        for (int nt = 0; nt < NT; ++nt) {
          for (int mi = 0; mi < 2; ++mi) {
            for (int e = 0; e < 2; ++e) {
              const float base = row_max[mi] == neg_inf ? 0.f : row_max[mi];   // nothing valid yet: exp2 -> 0
              const float p = metal::exp2(float(s[mi][nt].thread_elements()[e]) - base);
              s[mi][nt].thread_elements()[e] = p;
              row_sum[mi] += p;
            }
          }
        }

        // ---- 3b. O += P V ----
        for (int kt = 0; kt < NT; ++kt) {
          for (int dt = 0; dt < DT; ++dt) {
            simdgroup_matrix<float, 8, 8> vt;      // V tile: (token fm, dim fn + e)
            const int token = token0 + kt * 8 + fm;
            for (int e = 0; e < 2; ++e) {
              vt.thread_elements()[e] = Format::read(values + token * STRIDE, value_scales + token * Format::SCALE_BYTES,
                                                     dt * 8 + fn + e);
            }
            simdgroup_multiply_accumulate(acc[0][dt], s[0][kt], vt, acc[0][dt]);
            simdgroup_multiply_accumulate(acc[1][dt], s[1][kt], vt, acc[1][dt]);
          }
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);   // the next staging overwrites this chunk
  }

  // ---- 5. merge the token-splitting warps, write ----
  threadgroup float* warp_acc = mlxcel_shared;                  // [WARPS][16][D]
  threadgroup float* warp_max = warp_acc + WARPS * 16 * D;      // [WARPS][16]
  threadgroup float* warp_sum = warp_max + WARPS * 16;          // [WARPS][16]
  if (active) {
    for (int r = 0; r < 2; ++r) row_sum[r] = mlxcel::lane_sum(mlxcel::lane_sum(row_sum[r], 1), 8);
    if (fn == 0) {
      warp_max[warp * 16 + fm] = row_max[0];
      warp_max[warp * 16 + fm + 8] = row_max[1];
      warp_sum[warp * 16 + fm] = row_sum[0];
      warp_sum[warp * 16 + fm + 8] = row_sum[1];
    }
    for (int dt = 0; dt < DT; ++dt) {
      threadgroup float* top_row = warp_acc + (warp * 16 + fm) * D + dt * 8 + fn;
      top_row[0] = acc[0][dt].thread_elements()[0];
      top_row[1] = acc[0][dt].thread_elements()[1];
      top_row[8 * D] = acc[1][dt].thread_elements()[0];
      top_row[8 * D + 1] = acc[1][dt].thread_elements()[1];
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  // Per row: the split warps' weights, each divided by the row's total once,
  // and the row's lse; then the rows' D floats, four at a time.
  threadgroup float* split_scale = warp_sum + WARPS * 16;       // [WARPS][16]
  for (int i = lid; i < WM * 16; i += THREADS) {
    const int wm = i / 16, r = i % 16;
    float top = neg_inf;
    for (int j = 0; j < SPLIT; ++j) top = metal::max(top, warp_max[(j * WM + wm) * 16 + r]);
    float weight[SPLIT], total = 0.f;
    for (int j = 0; j < SPLIT; ++j) {
      const int w = (j * WM + wm) * 16 + r;
      weight[j] = top == neg_inf ? 0.f : metal::exp2(warp_max[w] - top);
      total += weight[j] * warp_sum[w];
    }
    const float inverse = total > 0.f ? 1.f / total : 0.f;
    for (int j = 0; j < SPLIT; ++j) split_scale[(j * WM + wm) * 16 + r] = weight[j] * inverse;
    const int head = (group * WM + wm) * 16 + r;
    if (head < heads) {
      out_lse[size_t(tile) * out_heads + kv_head * heads + head] = total > 0.f ? top + metal::log2(total) : neg_inf;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  constexpr int QUADS = D / 4;
  for (int i = lid; i < WM * 16 * QUADS; i += THREADS) {
    const int wm = i / (16 * QUADS), r = (i / QUADS) % 16, quad = i % QUADS;
    const int head = (group * WM + wm) * 16 + r;
    if (head >= heads) continue;
    float4 value = float4(0.f);
    for (int j = 0; j < SPLIT; ++j) {
      const int w = (j * WM + wm) * 16 + r;
      value += split_scale[w] * reinterpret_cast<threadgroup const float4*>(warp_acc + w * D)[quad];
    }
    const size_t out_row = size_t(tile) * out_heads + kv_head * heads + head;
    reinterpret_cast<device float4*>(out + out_row * D)[quad] = value;
  }
"""

MERGE_SOURCE = r"""
  constexpr int VEC = D / 32;                       // contiguous floats per lane
  const float neg_inf = -INFINITY;
  const int heads = v_in_shape[1];
  const int groups = indptr_shape[0] - 1;
  const size_t item = thread_position_in_grid.x / 32;
  const int lane = thread_index_in_simdgroup;
  if (item >= size_t(groups) * heads) return;      // whole simdgroups leave together
  const int group = item / heads, head = item % heads;
  const int begin = indptr[group], end = indptr[group + 1];

  float top = neg_inf;
  for (int i = begin + lane; i < end; i += 32) top = metal::max(top, static_cast<float>(lse_in[size_t(i) * heads + head]));
  for (ushort mask = 16; mask > 0; mask /= 2) top = mlxcel::lane_max(top, mask);

  float total = 0.f, value[VEC];
  for (int k = 0; k < VEC; ++k) value[k] = 0.f;
  if (top != neg_inf) {
    for (int i = begin; i < end; ++i) {
      const float weight = metal::exp2(static_cast<float>(lse_in[size_t(i) * heads + head]) - top);
      const device auto* src = v_in + (size_t(i) * heads + head) * D + lane * VEC;
      total += weight;
      for (int k = 0; k < VEC; ++k) {
        // A weightless state (lse -inf) may hold anything: select, never multiply.
        value[k] += weight > 0.f ? weight * static_cast<float>(src[k]) : 0.f;
      }
    }
  }
  device float* dst = out + item * D + lane * VEC;
  for (int k = 0; k < VEC; ++k) dst[k] = total > 0.f ? value[k] / total : 0.f;
  if (lane == 0) out_lse[item] = total > 0.f ? top + metal::log2(total) : neg_inf;
"""


CASCADE_MERGE_SOURCE = r"""
  constexpr int VEC = D / 32;                       // contiguous floats per lane
  const float neg_inf = -INFINITY;
  const int rows = indptrp_shape[0] - 1;
  const int q_heads = op_shape[1];
  const size_t item = thread_position_in_grid.x / 32;
  const int lane = thread_index_in_simdgroup;
  if (item >= size_t(rows) * q_heads) return;      // whole simdgroups leave together
  const int row = item / q_heads, head = item % q_heads;
  // The common layouts need no lookup first: one span, every row a member,
  // member m being row m (MEMBER_IS_ROW), and one private state per row
  // (PRIVATE_ONE).
  const int begin = PRIVATE_ONE ? row : indptrp[row];
  const int private_states = PRIVATE_ONE ? 1 : indptrp[row + 1] - begin;
  // Depth d: the tiles of the row's span there (level_map: first tile, tiles,
  // the member's slot) at its stacked head kv * (M * G) + m * G + g.
  const device float* level_o[4] = {o0, o1, o2, o3};
  const device float* level_lse[4] = {lse0, lse1, lse2, lse3};
  const int level_heads[4] = {int(o0_shape[1]), int(o1_shape[1]), int(o2_shape[1]), int(o3_shape[1])};
  int first[DEPTHS], count[DEPTHS], head_at[DEPTHS];
  int states = private_states;
  for (int d = 0; d < DEPTHS; ++d) {
    const device int* entry = level_map + (size_t(row) * DEPTHS + d) * 3;
    first[d] = MEMBER_IS_ROW ? 0 : entry[0];
    count[d] = MEMBER_IS_ROW ? int(o0_shape[0]) : entry[1];
    const int slot = MEMBER_IS_ROW ? row : entry[2];
    head_at[d] = (head / G) * (level_heads[d] / q_heads * G) + slot * G + head % G;
    states += count[d];
  }
  // (Metal has no lambdas: where state i lies, -1 private or its depth, is
  // spelled out in both passes.)

  float top = neg_inf;
  for (int i = lane; i < states; i += 32) {
    int where = -1, at = begin + i, j = i - private_states;
    for (int d = 0; d < DEPTHS; ++d) {
      if (j >= 0 && j < count[d]) { where = d; at = first[d] + j; }
      j -= count[d];
    }
    top = metal::max(top, where < 0 ? lsep[size_t(at) * q_heads + head]
                                    : level_lse[where][size_t(at) * level_heads[where] + head_at[where]]);
  }
  for (ushort mask = 16; mask > 0; mask /= 2) top = mlxcel::lane_max(top, mask);

  float total = 0.f, value[VEC];
  for (int k = 0; k < VEC; ++k) value[k] = 0.f;
  if (top != neg_inf) {
    for (int i = 0; i < states; ++i) {
      int where = -1, at = begin + i, j = i - private_states;
      for (int d = 0; d < DEPTHS; ++d) {
        if (j >= 0 && j < count[d]) { where = d; at = first[d] + j; }
        j -= count[d];
      }
      const size_t state = where < 0 ? size_t(at) * q_heads + head
                                     : size_t(at) * level_heads[where] + head_at[where];
      const float lse = where < 0 ? lsep[state] : level_lse[where][state];
      const float weight = metal::exp2(lse - top);
      const device float* src = (where < 0 ? op : level_o[where]) + state * D + lane * VEC;
      total += weight;
      for (int k = 0; k < VEC; ++k) value[k] += weight > 0.f ? weight * src[k] : 0.f;
    }
  }
  device TO* dst = out + item * D + lane * VEC;
  for (int k = 0; k < VEC; ++k) dst[k] = static_cast<TO>(total > 0.f ? value[k] / total : 0.f);
"""


# One body for every page format: a float pool's kernel has no scale inputs, so its Scales are empty.
FLOAT_PARTIAL_SOURCE = "  const mlxcel::Scales scales = {nullptr, nullptr, nullptr, nullptr};\n" + PARTIAL_SOURCE
QUANTIZED_PARTIAL_SOURCE = "  const mlxcel::Scales scales = {k_scales, v_scales, k_zeros, v_zeros};\n" + PARTIAL_SOURCE


def make_kernel(name: str, inputs: list, outputs: list, source: str, header: str, shared_bytes: int):
    # Threadgroup memory is declared in the source (sized from template
    # constants); Metal takes no dynamic size here.
    return mx.fast.metal_kernel(name=name, input_names=inputs, output_names=outputs, source=source,
                                header=header)


# 2 simdgroups x 32-token chunks, one stage: 17 KB of threadgroup memory at
# D=128 (the 32 KB limit also bounds the states, 2 x 16 x 130 floats).
KERNELS = FusedKernels(Platform("metal", HEADER, FLOAT_PARTIAL_SOURCE, MERGE_SOURCE, CASCADE_MERGE_SOURCE, make_kernel,
                                warps=2, chunk_tokens=32, stages=1, quantized_partial_source=QUANTIZED_PARTIAL_SOURCE))


# The backend API (kernels/__init__.py dispatches to these names).
paged_attention_partial = KERNELS.paged_attention_partial
prepare_partial = KERNELS.prepare_partial
merge_states = KERNELS.merge_states
prepare_merge = KERNELS.prepare_merge
takes = KERNELS.takes  # whether prepare_cascade runs this shape (else the generic two-level path)
prepare_cascade = KERNELS.prepare_cascade
cascade_decode = KERNELS.cascade_decode
