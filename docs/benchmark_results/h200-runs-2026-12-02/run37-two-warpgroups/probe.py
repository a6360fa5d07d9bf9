"""Level 0 on the warpgroup kernel with two warpgroups a block (128 heads read the staged K and V once)
against one (two head groups, each block reading the tile), the private level merging in both, side by side
in one process: gpu_step_profile's cascade arm with fused.WARPGROUPS_PER_BLOCK = 2, 1, 1, 2. Each read's tokens
are checked against the first read's. python probe.py OUT"""
import argparse
import json
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
    for name in (2, 1, 1, 2):
        fused.WARPGROUPS_PER_BLOCK = name
        arm = sp.profile_arm(loaded, batch, args, True, bandwidth, weights)
        tokens = arm.pop("tokens")
        first = first or tokens
        kernels = {k: [round(c, 1), round(ms, 3)] for k, (c, ms) in arm["kernels_by_name_per_step"].items()
                   if any(part in k for part in KERNELS)}
        reads.append({"warpgroups": name, "wall_ms": arm["wall_ms"], "host_ms": arm["host_ms"],
                      "encode_ms": arm["encode_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"],
                      "kernels_per_step": arm["kernels_per_step"], "kernels": kernels,
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
    (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| warpgroups a block | step ms | host ms | encode ms | GPU ms | kernels | level 0 ms | rows agree |",
             "|---|---|---|---|---|---|---|---|"]
    for r in reads:
        level0 = sum(ms for k, (c, ms) in r["kernels"].items() if "warpgroup" in k)
        lines.append(f"| {r['warpgroups']} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['encode_ms']:.2f} "
                     f"| {r['gpu_ms']:.2f} | {r['kernels_per_step']:.0f} | {level0:.3f} "
                     f"| {r['tokens_agree']['identical_rows']}/{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
