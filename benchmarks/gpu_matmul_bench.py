"""A decode step's projections: MLX's matmul (cuBLASLt) against the skinny kernel, GPU and host time.

    python benchmarks/gpu_matmul_bench.py --out OUTDIR [--rows 8 16 32 64] [--producer]
        [--sweep [--sweep-tiles 8x8x2 p4x4x12 ..]]

Per shape of an 8B layer (q/k/v, o, gate/up, down) and row count: the
kernel's GPU time per call (CUPTI through PyTorch's profiler, over a chain of
calls cycling through weights that together overflow the L2, so
every call reads its weight from memory), the bandwidth that makes, and the
host's encode time per call (``mx.async_eval`` of the chain, unprofiled; it
includes the small kernels that order each call after the last).
Each skinny result is checked against float64 first (max error over the
output's scale). ``--sweep`` times every launch shape in SWEEP at 32 rows
besides the one ``tiles_for`` picks (``--sweep-tiles``: these instead; a
leading p names producer_matmul's launch, n tiles x consumer warps x stages).
``--producer``: producer_matmul's launch as ``producer_tiles`` picks it too.
Needs CUDA and torch; writes matmul.json and matmul.md.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from gpu_attention_bench import depend
from gpu_timeline import complete_events
from mlxcel.kernels.cuda_matmul import (MAP_BOX_ROWS, SHARED_LIMIT, Tiles, producer_tiles, skinny_matmul,
                                        tiles_for, weight_map)

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}  # (N, K)
SWEEP = [f"{n}x{w}x{st}" for n in (4, 6, 8) for w in (2, 4, 8) for st in (3, 4, 6)]
L2_BYTES = 50 << 20
MAX_ERROR = 2.0**-6     # of the output's scale: bf16 rounding (2^-9) and float32 sums, with room


def chain_of(call, x: mx.array, chain: int) -> list[mx.array]:
    """``call`` chain times, each call's x depending on the previous output (the attention bench's
    ``depend``: small elementwise kernels), so that the calls run one after another, as a layer's do, not
    side by side."""
    outs, xi = [], x
    for i in range(chain):
        outs.append(call(xi, i))
        xi = depend(x, outs[-1])
    return outs


def gpu_time(call, x: mx.array, chain: int) -> tuple[float, float, list[str]]:
    """(GPU us per call of the call's own kernels under CUPTI, host encode us per call without the
    profiler, the kernels' names) of a chain of ``call(x, i)``."""
    from torch.profiler import ProfilerActivity, profile  # CUPTI; imported where it runs

    mx.eval(chain_of(call, x, chain))
    outs = chain_of(call, x, chain)
    start = time.perf_counter()
    mx.async_eval(outs)
    encode = (time.perf_counter() - start) / chain * 1e6
    mx.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        mx.eval(chain_of(call, x, chain))
    kernels = [e for e in complete_events(prof) if e.get("cat") == "kernel" and "binary" not in e["name"].lower()]
    # A call may be more than one kernel (cuBLAS's split-K reduction).
    return sum(e["dur"] for e in kernels) / chain, encode, sorted({e["name"][:80] for e in kernels})


def launch_shape(text: str, m_tiles: int) -> Tiles:
    """A sweep's launch shape: NxWxS (n tiles x warps x stages), skinny_matmul's; pNxCxS (n tiles x consumer
    warps x stages), producer_matmul's, one block an SM."""
    producer = text.startswith("p")
    n_tiles, warps, stages = (int(v) for v in text.removeprefix("p").split("x"))
    return Tiles(m_tiles, n_tiles, warps, stages, loop=producer, producer=producer)


def label(tiles: Tiles) -> str:
    shape = f"{tiles.n_tiles}x{tiles.warps}x{tiles.stages}"
    if tiles.producer:
        return f"producer {shape}" + ("" if tiles.loop else " one tile a block")
    return f"skinny {shape}" + (" looping" if tiles.loop else "")


def as64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32), dtype=np.float64)


def error(y: mx.array, want: np.ndarray) -> float:
    return float(np.abs(as64(y).reshape(want.shape) - want).max() / np.abs(want).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--chain", type=int, default=24)
    parser.add_argument("--producer", action="store_true", help="time producer_tiles' launch too")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--sweep-tiles", nargs="+", metavar="[p]NxWxS",
                        help="the launch shapes to sweep (n tiles x warps x stages; a leading p: producer_matmul's, "
                             "n tiles x consumer warps x stages) instead of SWEEP's")
    args = parser.parse_args()
    sweep = args.sweep_tiles or SWEEP
    args.out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    results = []
    for name, (n, k) in SHAPES.items():
        copies = max(2, -(-2 * L2_BYTES // (n * k * 2)))
        weights = [(mx.random.normal((n, k)) * k ** -0.5).astype(mx.bfloat16) for _ in range(copies)]
        transposed = [w.T for w in weights]
        mx.eval(weights, transposed)
        floor_us = n * k * 2 / 4.8e12 * 1e6
        w64 = as64(weights[0])
        maps = None
        for rows in args.rows:
            x = mx.random.normal((rows, 1, k)).astype(mx.bfloat16)
            picked, producer_pick = tiles_for(rows, n), producer_tiles(rows, n)
            want = as64(x).reshape(rows, k) @ w64.T
            arms = {"mlx": lambda x, i: x @ transposed[i % copies]}
            # A looping launch beside the same tiles one a block (several waves of blocks).
            configs = [picked] + [replace(picked, loop=False)] * picked.loop + [producer_pick] * args.producer
            swept = [launch_shape(shape, picked.m_tiles) for shape in sweep] if args.sweep and rows == 32 else []
            configs += [t for t in swept if t not in configs and t.shared_bytes() <= SHARED_LIMIT]
            # A producer launch of the engine's box rows reads each weight's map made once, as the engine's
            # Linear makes it at load (others make theirs at each call: an eval and fresh memory a call).
            if maps is None and any(t.producer and 4 * t.n_tiles == MAP_BOX_ROWS for t in configs):
                maps = [weight_map(w) for w in weights]
            for tiles in configs:
                arms[label(tiles)] = lambda x, i, t=tiles: skinny_matmul(
                    x, weights[i % copies], t, tensor_map=maps[i % copies] if t.producer and maps else None)
            for arm, call in arms.items():
                err = error(call(x, 0), want)
                assert err < MAX_ERROR, f"{name} x {rows} rows, {arm}: max error {err:.2e} of the output's scale"
                gpu_us, encode_us, names = gpu_time(call, x, args.chain)
                row = {"kernels": names, "shape": name, "n": n, "k": k, "rows": rows, "arm": arm, "gpu_us": gpu_us,
                       "tb_s": n * k * 2 / gpu_us / 1e6, "floor_us": floor_us, "encode_us": encode_us,
                       "max_error": err, "picked": arm == label(picked),
                       "producer_pick": args.producer and arm == label(producer_pick)}
                results.append(row)
                print(json.dumps(row), flush=True)
    (args.out / "matmul.json").write_text(json.dumps({"device": mx.device_info().get("device_name", ""),
                                                       "results": results}, indent=1))
    lines = ["| shape | rows | arm (n tiles x warps x stages) | GPU us | TB/s | floor us (4.8 TB/s) "
             "| encode us | max error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        mark = " (picked)" if r["picked"] else " (producer_tiles)" if r.get("producer_pick") else ""
        lines.append(f"| {r['shape']} | {r['rows']} | {r['arm']}{mark} | {r['gpu_us']:.2f} | {r['tb_s']:.2f} "
                     f"| {r['floor_us']:.2f} | {r['encode_us']:.1f} | {r['max_error']:.2e} |")
    (args.out / "matmul.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
