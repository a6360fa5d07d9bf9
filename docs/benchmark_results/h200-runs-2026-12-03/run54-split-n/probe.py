"""gate/up's launch on split_n_matmul (warps splitting N over one shared x stage: 384 blocks of 4 warps, a
ring of 6 or 8 chunks) against main's looping launch, in one process: gpu_step_profile's cascade arm in the
order main, split6, split8, split8, split6, main. Each read's tokens are checked against the first read's.
python probe.py OUT Ran at 307f456 (since backed out)."""
import argparse
import json
import sys
from pathlib import Path

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.kernels import cuda_matmul
from mlxcel.kernels.cuda_matmul import PRODUCT, Tiles

KERNELS = ("skinny",)
PICK = cuda_matmul.tiles_for


def picker(stages: int | None):
    def tiles_for(rows: int, n: int, epilogue=PRODUCT) -> Tiles:
        if stages and epilogue.swiglu and n == 24576 and rows <= 32:
            return Tiles(2, 2, 4, stages, split_n=True)
        return PICK(rows, n, epilogue)
    return tiles_for


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    reads, first = [], None
    for name, stages in (("main", None), ("split6", 6), ("split8", 8), ("split8", 8), ("split6", 6), ("main", None)):
        cuda_matmul.tiles_for = picker(stages)
        for layer in loaded.model.layers:     # the traces hold the launches as they were made
            layer.halves.forget_traces()
        e2e.warm_up(loaded, batch, args.block_size, args.shared)
        arm = sp.profile_arm(loaded, batch, args, True, bandwidth, weights)
        tokens = arm.pop("tokens")
        first = first or tokens
        kernels = {k: [round(c, 1), round(ms, 3)] for k, (c, ms) in arm["kernels_by_name_per_step"].items()
                   if any(part in k for part in KERNELS)}
        reads.append({"state": name, "wall_ms": arm["wall_ms"], "host_ms": arm["host_ms"],
                      "encode_ms": arm["encode_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"],
                      "kernels": kernels, "spread_us": arm.get("kernel_us_median_max"),
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
        (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| state | step ms | host ms | encode ms | GPU ms | skinny ms | gate/up ms (median us) | rows agree |",
             "|---|---|---|---|---|---|---|---|"]
    for r in reads:
        skinny = sum(ms for _, ms in r["kernels"].values())
        gate_up = max(r["kernels"], key=lambda k: r["kernels"][k][1])     # the largest launch a step
        lines.append(f"| {r['state']} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['encode_ms']:.2f} "
                     f"| {r['gpu_ms']:.2f} | {skinny:.3f} | {r['kernels'][gate_up][1]:.3f} "
                     f"({r['spread_us'][gate_up][0]:.1f}) "
                     f"| {r['tokens_agree']['identical_rows']}/{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
