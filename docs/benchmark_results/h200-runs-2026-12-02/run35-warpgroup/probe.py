"""Cascade level 0 on the partial kernel (mma.sync) and on the warpgroup kernel (wgmma), side by side in one
process: gpu_step_profile's cascade arm with MLXCEL_LEVEL0_KERNEL = mma, warpgroup, warpgroup, mma. Each
read's tokens are checked against the first read's. python probe.py OUT"""
import argparse
import json
import os
import sys
from pathlib import Path

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.kernels import fused

KERNELS = ("skinny", "partial", "split_heads", "merge")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    e2e.warm_up(loaded, batch, args.block_size, args.shared)
    reads, first = [], None
    for kernel in ("mma", "warpgroup", "warpgroup", "mma"):
        os.environ[fused.LEVEL0_KERNEL_ENV] = kernel
        arm = sp.profile_arm(loaded, batch, args, True, bandwidth, weights)
        tokens = arm.pop("tokens")
        first = first or tokens
        kernels = {k: [round(c, 1), round(ms, 3)] for k, (c, ms) in arm["kernels_by_name_per_step"].items()
                   if any(part in k for part in KERNELS)}
        reads.append({"level0": kernel, "wall_ms": arm["wall_ms"], "host_ms": arm["host_ms"],
                      "encode_ms": arm["encode_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"], "kernels": kernels,
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
    (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| level 0 | step ms | host ms | encode ms | GPU ms | level 0 ms | rows agree with the first read |",
             "|---|---|---|---|---|---|---|"]
    for r in reads:
        level0 = sum(ms for k, (c, ms) in r["kernels"].items() if "warpgroup" in k or "_t_4_64" in k)
        lines.append(f"| {r['level0']} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['encode_ms']:.2f} "
                     f"| {r['gpu_ms']:.2f} | {level0:.3f} "
                     f"| {r['tokens_agree']['identical_rows']}/{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
