"""The skinny matmul with x staged through L1 (cp.async.ca: blocks sharing an SM read x once between them) against
the shipped kernel (x through L2 only, cp.async.cg), at 32 rows, launch shapes that put one, two or three blocks on
an SM; GPU time per call as gpu_matmul_bench.py measures it, each arm checked against float64 first.
python probe.py OUT [--ncu]: with --ncu, only a few calls of each shipped launch (for ncu to profile)."""
import hashlib
import json
import sys
from pathlib import Path

import mlx.core as mx

import mlxcel.kernels.cuda_matmul as cm
from gpu_matmul_bench import L2_BYTES, MAX_ERROR, SHAPES, as64, error, gpu_time

X_COPY = "copy16(slot + (2 * N_TILES + (half * M_TILES + i2) * 2 + h) * 32, x_row[i2][h]"
assert cm.LIBRARY.count(X_COPY) == 1
L1_LIBRARY = cm.LIBRARY.replace(X_COPY, X_COPY.replace("copy16(", "copy16_l1(")).replace(
    "namespace mlxcel_matmul {\n",
    """namespace mlxcel_matmul {\n
__device__ __forceinline__ void copy16_l1(void* shared, const void* global, bool live) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\\n"
               :: "r"(mlxcel::shared_address(shared)), "l"(global), "r"(live ? 16 : 0));
}
""", 1)
assert "copy16_l1(slot" in L1_LIBRARY


def kernel(library: str, shared: int):
    call = cm.PRODUCT.call()
    digest = hashlib.sha1((library + call).encode()).hexdigest()[:12]
    return cm.make_kernel(f"mlxcel_skinny_matmul_{digest}_{shared}", cm.PRODUCT.inputs(), ["y"], call,
                          cm.compact_source(library), shared)


def launch(library: str, x: mx.array, w: mx.array, tiles: cm.Tiles) -> mx.array:
    n, k = w.shape
    y, = kernel(library, tiles.shared_bytes())(
        inputs=[x, w], template=[("T", x.dtype), ("M_TILES", tiles.m_tiles), ("N_TILES", tiles.n_tiles),
                                 ("WARPS", tiles.warps), ("STAGES", tiles.stages), ("EPS_BITS", 0)],
        grid=(tiles.blocks(n) * tiles.warps * 32, 1, 1), threadgroup=(tiles.warps * 32, 1, 1),
        output_shapes=[(*x.shape[:-1], n)], output_dtypes=[x.dtype])
    return y


# (n tiles, warps, stages) per shape: the shipped pick first, then variants.
VARIANTS = {"qkv": [(6, 4, 3), (6, 4, 2), (3, 4, 2), (3, 4, 3)],
            "o": [(4, 8, 3), (4, 4, 2), (2, 4, 2), (2, 4, 3), (4, 8, 2)],
            "gate_up": [(8, 4, 3), (8, 4, 2), (4, 4, 2), (4, 8, 2)],
            "down": [(4, 8, 3), (4, 4, 2), (2, 4, 2), (2, 4, 3), (4, 8, 2)]}


def main() -> None:
    out, ncu = Path(sys.argv[1]), "--ncu" in sys.argv
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    rows, results = 32, []
    for name, (n, k) in SHAPES.items():
        copies = max(2, -(-2 * L2_BYTES // (n * k * 2)))
        weights = [(mx.random.normal((n, k)) * k ** -0.5).astype(mx.bfloat16) for _ in range(copies)]
        mx.eval(weights)
        x = mx.random.normal((rows, 1, k)).astype(mx.bfloat16)
        want = as64(x).reshape(rows, k) @ as64(weights[0]).T
        picked = cm.tiles_for(rows, n)
        assert (picked.n_tiles, picked.warps, picked.stages) == VARIANTS[name][0], (name, picked)
        for shape in VARIANTS[name][:1] if ncu else VARIANTS[name]:
            tiles = cm.Tiles(picked.m_tiles, *shape)
            for path, library in (("L2", cm.LIBRARY), ("L1", L1_LIBRARY)):
                def call(x, i, library=library, tiles=tiles):
                    return launch(library, x, weights[i % copies], tiles)
                err = error(call(x, 0), want)
                assert err < MAX_ERROR, f"{name} {shape} {path}: max error {err:.2e}"
                if ncu:
                    mx.eval(call(x, 1))
                    continue
                gpu_us, _, _ = gpu_time(call, x, 24)
                row = {"shape": name, "tiles": "x".join(map(str, shape)), "x_path": path, "gpu_us": gpu_us,
                       "shared_kb": tiles.shared_bytes() / 1024, "blocks": tiles.blocks(n), "max_error": err}
                results.append(row)
                print(json.dumps(row), flush=True)
    if not ncu:
        (out / "probe.json").write_text(json.dumps(results, indent=1))
        lines = ["| shape | tiles (n x warps x stages) | x path | GPU us | shared KB | blocks |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['shape']} | {r['tiles']} | {r['x_path']} | {r['gpu_us']:.2f} | {r['shared_kb']:.0f} "
                  f"| {r['blocks']} |" for r in results]
        (out / "probe.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
