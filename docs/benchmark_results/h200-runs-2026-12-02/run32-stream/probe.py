"""How fast can a block stream gate/up's weight (24576 x 4096 bf16, 201 MB) into shared memory, with nothing
computed? The skinny kernel's copies (cp.async, 16 bytes a lane, four lanes 64 bytes of a row, a ring of 3 per
warp), the same with eight lanes reading a row's whole 128-byte line, and the copy engine's bulk copies
(cp.async.bulk, an mbarrier a stage): a row's 128 bytes a copy into a ring per warp, or 512 bytes a copy
into a ring of 6 shared by the block. Beside them: the skinny kernel and cuBLAS at 32 rows. GPU us from CUPTI
(gpu_matmul_bench.gpu_time), weights cycled past the L2. python probe.py OUT"""
import json
import sys
from pathlib import Path

import mlx.core as mx

from gpu_matmul_bench import L2_BYTES, gpu_time
from mlxcel.kernels.cuda_matmul import Tiles, skinny_matmul

N, K, ROWS = 24576, 4096, 32
HEADER = r"""
namespace probe {
__device__ __forceinline__ uint32_t smem(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem(dst)), "l"(src));
}
__device__ __forceinline__ void init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem(bar)));
}
__device__ __forceinline__ void expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t phase) {
  asm volatile("{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT_%=;\n}\n"
               :: "r"(smem(bar)), "r"(phase) : "memory");
}
__device__ __forceinline__ void bulk(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem(dst)), "l"(src), "r"(bytes), "r"(smem(bar)) : "memory");
}
}
"""
# A block: 64 weight rows, 4 warps; each kernel sums one staged word a lane a chunk (so nothing is dead).
CP_ASYNC = r"""
  constexpr int S = 3, WARPS = 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int K = w_shape[1];
  const T* base = w + size_t(blockIdx.x) * 64 * K;
  extern __shared__ __align__(16) unsigned char shared[];
  uint4* ring = reinterpret_cast<uint4*>(shared) + warp * S * 512;
  const int mine = K / 64 / WARPS;
  auto stage = [&](int i) {
    if (i < mine) {
      const int k = (warp + i * WARPS) * 64;
      #pragma unroll
      for (int j = 0; j < 16; ++j) {
        const T* src = LINES ? base + size_t(j * 4 + lane / 8) * K + k + (lane % 8) * 8
                             : base + size_t((j % 8) * 8 + g) * K + k + (j / 8) * 32 + t * 8;
        probe::copy16(ring + (i % S) * 512 + j * 32 + lane, src);
      }
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
  float acc = 0.f;
  for (int s = 0; s < S - 1; ++s) stage(s);
  for (int c = 0; c < mine; ++c) {
    asm volatile("cp.async.wait_group 1;\n" ::);
    stage(c + S - 1);
    acc += __int_as_float(ring[(c % S) * 512 + lane].x);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
"""
BULK_WARP = r"""
  constexpr int S = 3, WARPS = 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int K = w_shape[1];
  const T* base = w + size_t(blockIdx.x) * 64 * K;
  extern __shared__ __align__(128) unsigned char shared[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(shared) + warp * S;
  unsigned char* ring = shared + 128 + warp * S * 8192;
  if (lane == 0) for (int s = 0; s < S; ++s) probe::init(bars + s);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
  const int mine = K / 64 / WARPS;
  auto stage = [&](int i) {
    if (i < mine) {
      const int k = (warp + i * WARPS) * 64;
      if (lane == 0) probe::expect(bars + i % S, 8192);
      __syncwarp();
      #pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = 2 * lane + r;
        probe::bulk(ring + (i % S) * 8192 + row * 128, base + size_t(row) * K + k, 128, bars + i % S);
      }
    }
  };
  float acc = 0.f;
  for (int s = 0; s < S - 1; ++s) stage(s);
  for (int c = 0; c < mine; ++c) {
    probe::wait(bars + c % S, (c / S) & 1);
    acc += __int_as_float(reinterpret_cast<const uint32_t*>(ring + (c % S) * 8192)[lane * 4]);
    __syncwarp();
    stage(c + S - 1);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
"""
BULK_BLOCK = r"""
  constexpr int S = 6, PIECE = 512;               // a row's 256 k a copy: 32 KB a stage
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int K = w_shape[1];
  const T* base = w + size_t(blockIdx.x) * 64 * K;
  extern __shared__ __align__(128) unsigned char shared[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(shared);
  unsigned char* ring = shared + 128;
  if (threadIdx.x == 0) for (int s = 0; s < S; ++s) probe::init(bars + s);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  const int chunks = K * 2 / PIECE;
  auto stage = [&](int i) {
    if (warp == 0 && i < chunks) {
      if (lane == 0) probe::expect(bars + i % S, 64 * PIECE);
      __syncwarp();
      #pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = 2 * lane + r;
        probe::bulk(ring + (i % S) * 64 * PIECE + row * PIECE, base + size_t(row) * K + i * (PIECE / 2), PIECE,
                    bars + i % S);
      }
    }
  };
  float acc = 0.f;
  for (int s = 0; s < S - 1; ++s) stage(s);
  for (int c = 0; c < chunks; ++c) {
    probe::wait(bars + c % S, (c / S) & 1);
    acc += __int_as_float(reinterpret_cast<const uint32_t*>(ring + (c % S) * 64 * PIECE)[threadIdx.x * 4]);
    __syncthreads();
    stage(c + S - 1);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
"""


def kernel(name, source, shared, lines=False):
    k = mx.fast.cuda_kernel(name=name, input_names=["x", "w"], output_names=["out"],
                            source=source.replace("LINES", "true" if lines else "false"), header=HEADER,
                            shared_memory=shared)
    return lambda x, w: k(inputs=[x, w], template=[("T", w.dtype)], grid=(N // 64 * 128, 1, 1),
                          threadgroup=(128, 1, 1), output_shapes=[(N // 64 * 128,)], output_dtypes=[mx.float32])[0]


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    copies = max(2, -(-2 * L2_BYTES // (N * K * 2)))
    weights = [(mx.random.normal((N, K)) * K ** -0.5).astype(mx.bfloat16) for _ in range(copies)]
    x = mx.random.normal((ROWS, 1, K)).astype(mx.bfloat16)
    mx.eval(weights, x)
    arms = {
        "cp.async 64 B a row (skinny's)": kernel("probe_cp_async", CP_ASYNC, 4 * 3 * 8192),
        "cp.async 128 B a row": kernel("probe_cp_async_lines", CP_ASYNC, 4 * 3 * 8192, lines=True),
        "bulk 128 B, ring of 3 a warp": kernel("probe_bulk_warp", BULK_WARP, 128 + 4 * 3 * 8192),
        "bulk 512 B, ring of 6 a block": kernel("probe_bulk_block", BULK_BLOCK, 128 + 6 * 64 * 512),
    }
    calls = {name: (lambda x, i, f=f: f(x, weights[i % copies])) for name, f in arms.items()}
    calls["skinny 8x4x3, 32 rows"] = lambda x, i: skinny_matmul(x, weights[i % copies], Tiles(2, 8, 4, 3))
    calls["cuBLAS, 32 rows"] = lambda x, i: x @ weights[i % copies].T
    results = []
    for name in list(calls) + list(calls)[::-1]:
        gpu_us, encode_us, kernels = gpu_time(calls[name], x, 24)
        results.append({"arm": name, "gpu_us": gpu_us, "tb_s": N * K * 2 / gpu_us / 1e6, "kernels": kernels})
        print(json.dumps(results[-1]), flush=True)
    (out / "probe.json").write_text(json.dumps(results, indent=1))
    lines = ["| arm | GPU us | TB/s |", "|---|---|---|"]
    lines += [f"| {r['arm']} | {r['gpu_us']:.1f} | {r['tb_s']:.2f} |" for r in results]
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
