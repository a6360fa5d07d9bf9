"""The engine's decode step with every projection on producer_matmul (cuda_matmul.PRODUCER) against
skinny_matmul's launches, in one process: gpu_step_profile's cascade arm in the order mma, producer,
producer, mma. Each read's tokens are checked against the first read's; each read lists the launches
tiles_for picked (to show which kernel took them). python probe.py OUT"""
import argparse
import json
import sys
from pathlib import Path

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.kernels import cuda_matmul

PICK = cuda_matmul.tiles_for


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    reads, first = [], None
    for state in ("mma", "producer", "producer", "mma"):
        cuda_matmul.PRODUCER = state == "producer"
        picks = set()

        def tiles_for(rows, n, epilogue=cuda_matmul.PRODUCT):
            tiles = PICK(rows, n, epilogue)
            picks.add(f"{rows}x{n} {epilogue}: {tiles}")
            return tiles
        cuda_matmul.tiles_for = tiles_for     # the warm-up's launches recorded, the timed ones left alone
        for layer in loaded.model.layers:     # the traces hold the launches as they were made
            layer.halves.forget_traces()
        e2e.warm_up(loaded, batch, args.block_size, args.shared)
        cuda_matmul.tiles_for = PICK
        arm = sp.profile_arm(loaded, batch, args, True, None, bandwidth, weights)
        tokens = arm.pop("tokens")
        first = first or tokens
        # Each skinny kernel: [calls a step, ms a step, median us a call]; q/k/v and gate/up run 36 times a
        # step, o and down (one kernel) 72.
        skinny = sorted(([round(c, 1), round(ms, 3), round(arm["kernel_us_median_max"][k][0], 1)]
                         for k, (c, ms) in arm["kernels_by_name_per_step"].items() if "skinny" in k),
                        key=lambda r: (r[0], r[2]))
        reads.append({"state": state, "wall_ms": arm["wall_ms"], "host_ms": arm["host_ms"],
                      "encode_ms": arm["encode_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"],
                      "skinny": skinny, "skinny_ms": sum(r[1] for r in skinny),
                      "tokens_agree": e2e.agreement(first, tokens), "picks": sorted(picks)})
        print(json.dumps(reads[-1]), flush=True)
        (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| state | step ms | host ms | encode ms | GPU ms | skinny ms | skinny kernels (calls: median us) "
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
