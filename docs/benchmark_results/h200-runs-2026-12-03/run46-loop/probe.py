"""The skinny matmul's looping launch (a block takes every 128th column tile, its rings running on across
tiles) against one tile a block, in one process: gpu_step_profile's cascade arm in the order looping, one
tile, one tile, looping. Only gate/up loops (384 column tiles; the other projections are one wave of
blocks). Each read's tokens are checked against the first read's. python probe.py OUT"""
import argparse
import dataclasses
import json
import sys
from pathlib import Path

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.kernels import cuda_matmul

KERNELS = ("skinny", "partial", "split_heads")
LOOPING = cuda_matmul.tiles_for


def one_tile(rows, n, epilogue=cuda_matmul.PRODUCT):
    return dataclasses.replace(LOOPING(rows, n, epilogue), loop=False)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    reads, first = [], None
    for name in ("looping", "one tile", "one tile", "looping"):
        cuda_matmul.tiles_for = LOOPING if name == "looping" else one_tile
        for layer in loaded.model.layers:
            layer.halves.forget_traces()
        e2e.warm_up(loaded, batch, args.block_size, args.shared)
        arm = sp.profile_arm(loaded, batch, args, True, bandwidth, weights)
        tokens = arm.pop("tokens")
        first = first or tokens
        kernels = {k: [round(c, 1), round(ms, 3)] for k, (c, ms) in arm["kernels_by_name_per_step"].items()
                   if any(part in k for part in KERNELS)}
        reads.append({"state": name, "wall_ms": arm["wall_ms"], "host_ms": arm["host_ms"],
                      "encode_ms": arm["encode_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"],
                      "kernels_per_step": arm["kernels_per_step"], "kernels": kernels,
                      "spread_us": arm.get("kernel_us_median_max"), "longest_us": arm.get("longest_kernels_us"),
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
    (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| state | step ms | host ms | encode ms | GPU ms | kernels | gate/up ms | rows agree |",
             "|---|---|---|---|---|---|---|---|"]
    for r in reads:
        gate_up = sum(ms for k, (c, ms) in r["kernels"].items() if "skinny" in k and c == 36.0 and ms > 2.0)
        lines.append(f"| {r['state']} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['encode_ms']:.2f} "
                     f"| {r['gpu_ms']:.2f} | {r['kernels_per_step']:.0f} | {gate_up:.3f} "
                     f"| {r['tokens_agree']['identical_rows']}/{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
