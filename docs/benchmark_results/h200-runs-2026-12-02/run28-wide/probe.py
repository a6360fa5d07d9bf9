"""gate/up at 32 rows as the step launches it (the norm on the way in, swiglu out) and as a plain product:
256 blocks of 96 columns against 384 of 64, twice in the order A B B A; GPU time per call as
gpu_matmul_bench.py measures it, each arm checked against the other first. python probe.py OUT"""
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

from gpu_matmul_bench import L2_BYTES, as64, gpu_time
from mlxcel.kernels.cuda_matmul import Tiles, skinny_matmul

N, K, ROWS, EPS = 24576, 4096, 32, 1e-6
ARMS = {"64 columns": Tiles(2, 8, 4, 3), "96 columns": Tiles(2, 12, 4, 3)}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    copies = max(2, -(-2 * L2_BYTES // (N * K * 2)))
    weights = [(mx.random.normal((N, K)) * K ** -0.5).astype(mx.bfloat16) for _ in range(copies)]
    g = mx.random.uniform(0.5, 1.5, (K,)).astype(mx.bfloat16)
    x = (3 * mx.random.normal((ROWS, 1, K))).astype(mx.bfloat16)
    mx.eval(weights, g, x)
    results = []
    for epilogue in ("norm+swiglu", "product"):
        calls = {}
        for name, tiles in ARMS.items():
            if epilogue == "product":
                calls[name] = lambda x, i, t=tiles: skinny_matmul(x, weights[i % copies], t)
            else:
                calls[name] = lambda x, i, t=tiles: skinny_matmul(x, weights[i % copies], t, norm=(g, EPS), swiglu=True)
        a, b = (as64(call(x, 0)) for call in calls.values())
        spread = float(np.abs(a - b).max() / np.abs(a).max())
        assert spread < 2.0**-6, f"{epilogue}: the arms differ by {spread:.2e} of the output's scale"
        names = list(ARMS)
        for name in names + names[::-1]:
            gpu_us, encode_us, _ = gpu_time(calls[name], x, 24)
            results.append({"epilogue": epilogue, "arm": name, "gpu_us": gpu_us, "encode_us": encode_us,
                            "arms_differ": spread})
            print(json.dumps(results[-1]), flush=True)
    (out / "probe.json").write_text(json.dumps(results, indent=1))
    lines = ["| epilogue | arm | GPU us | encode us |", "|---|---|---|---|"]
    lines += [f"| {r['epilogue']} | {r['arm']} | {r['gpu_us']:.2f} | {r['encode_us']:.1f} |" for r in results]
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
