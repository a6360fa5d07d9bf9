"""The engine's cascade decode step with o's and down's products split-K on producer_matmul (the branch
splitk) against the same step with them on the skinny kernel (their tensor maps not passed; gate/up on TMA in
both), in one process: gpu_step_profile's cascade arm in the order split, skinny, skinny, split. Each read's
tokens are checked against the first read's; each read lists the matmul kernels' calls a step and median us
(skinny and producer launches are both named mlxcel_skinny_matmul_*). python probe.py OUT"""
import argparse
import json
import sys
from pathlib import Path

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.kernels import cuda_matmul

LAUNCH = cuda_matmul.skinny_matmul


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    reads, first = [], None
    for state in ("split", "skinny", "skinny", "split"):
        def launch(x, weight, tiles=None, *, residual=None, tensor_map=None, **folds):
            if state == "skinny" and residual is not None:
                tensor_map = None
            return LAUNCH(x, weight, tiles, residual=residual, tensor_map=tensor_map, **folds)
        cuda_matmul.skinny_matmul = launch
        for layer in loaded.model.layers:     # the traces hold the launches as they were made
            layer.halves.forget_traces()
        e2e.warm_up(loaded, batch, args.block_size, args.shared)
        arm = sp.profile_arm(loaded, batch, args, True, None, bandwidth, weights)
        tokens = arm.pop("tokens")
        first = first or tokens
        # Each matmul kernel: [calls a step, ms a step, median us a call].
        skinny = sorted(([round(c, 1), round(ms, 3), round(arm["kernel_us_median_max"][k][0], 1)]
                         for k, (c, ms) in arm["kernels_by_name_per_step"].items() if "skinny" in k),
                        key=lambda r: (r[0], r[2]))
        reads.append({"state": state, "wall_ms": arm["wall_ms"], "host_ms": arm["host_ms"],
                      "encode_ms": arm["encode_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"],
                      "skinny": skinny, "skinny_ms": sum(r[1] for r in skinny),
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
        (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| state | step ms | host ms | encode ms | GPU ms | matmul ms | matmul kernels (calls: median us) "
             "| rows agree |", "|---|---|---|---|---|---|---|---|"]
    for r in reads:
        kernels = ", ".join(f"{calls:.0f}: {us:.1f}" for calls, _, us in r["skinny"])
        lines.append(f"| {r['state']} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['encode_ms']:.2f} "
                     f"| {r['gpu_ms']:.2f} | {r['skinny_ms']:.3f} | {kernels} "
                     f"| {r['tokens_agree']['identical_rows']}/{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
