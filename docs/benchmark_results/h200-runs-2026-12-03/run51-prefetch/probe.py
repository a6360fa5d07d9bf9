"""The skinny matmul prefetching the next projection's weight into L2 (cuda_matmul ``then``), and level 0 on a
ring of three chunks, against main, in one process: gpu_step_profile's cascade arm in the order main,
prefetch, prefetch+ring3, prefetch+ring3, prefetch, main, each kernel's spread over its calls. Each read's
tokens are checked against the first read's. python probe.py OUT Ran at e133cb1 (since backed out)."""
import argparse
import functools
import json
import sys
from pathlib import Path

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.kernels import cuda, cuda_matmul

KERNELS = ("skinny", "partial", "split_heads")
BUDGET = cuda_matmul.PREFETCH_BYTES
PREPARE = cuda.KERNELS.prepare_cascade


def configure(loaded, name: str) -> None:
    cuda_matmul.PREFETCH_BYTES = 0 if name == "main" else BUDGET
    cuda.prepare_cascade = (functools.partial(PREPARE, level0_stages=3) if name.endswith("ring3") else PREPARE)
    for layer in loaded.model.layers:     # the traces hold the launches as they were made
        layer.halves.forget_traces()


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    reads, first = [], None
    for name in ("main", "prefetch", "prefetch+ring3", "prefetch+ring3", "prefetch", "main"):
        configure(loaded, name)
        e2e.warm_up(loaded, batch, args.block_size, args.shared)
        arm = sp.profile_arm(loaded, batch, args, True, bandwidth, weights)
        tokens = arm.pop("tokens")
        first = first or tokens
        kernels = {k: [round(c, 1), round(ms, 3)] for k, (c, ms) in arm["kernels_by_name_per_step"].items()
                   if any(part in k for part in KERNELS)}
        reads.append({"state": name, "wall_ms": arm["wall_ms"], "host_ms": arm["host_ms"],
                      "encode_ms": arm["encode_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"],
                      "walls_last_32": arm["wall_ms_each"][-32:],
                      "kernels_per_step": arm["kernels_per_step"], "kernels": kernels,
                      "spread_us": arm.get("kernel_us_median_max"), "longest_us": arm.get("longest_kernels_us"),
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
        (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| state | step ms | host ms | encode ms | GPU ms | skinny ms | level 0 ms (median us) "
             "| private ms | rows agree |", "|---|---|---|---|---|---|---|---|---|"]
    for r in reads:
        skinny = sum(ms for k, (_, ms) in r["kernels"].items() if "skinny" in k)
        level0 = next(k for k in r["kernels"] if "warpgroup_partial" in k)
        private = next(k for k in r["kernels"] if "merged_partial" in k)
        lines.append(f"| {r['state']} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['encode_ms']:.2f} "
                     f"| {r['gpu_ms']:.2f} | {skinny:.3f} | {r['kernels'][level0][1]:.3f} "
                     f"({r['spread_us'][level0][0]:.1f}) | {r['kernels'][private][1]:.3f} "
                     f"| {r['tokens_agree']['identical_rows']}/{r['tokens_agree']['rows']} |")
    lines += ["", "skinny launches, us a call (median) per read:"]
    for r in reads:
        lines.append(f"- {r['state']}: " + ", ".join(f"{'_'.join(k.split('_')[5:7])} {r['spread_us'][k][0]:.1f}"
                                                     for k in r["kernels"] if "skinny" in k))
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
