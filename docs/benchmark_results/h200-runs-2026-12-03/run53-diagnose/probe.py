"""Where the cascade step's remaining stalls come from: gpu_step_profile's cascade arm with MLX's buffer cache
as it is and with none (mx.set_cache_limit(0): every array a fresh allocation, so no buffer a host array
used is ever a kernel's output and no output's pages were last on the host), in the order cached, uncached,
uncached, cached; each kernel's median and slowest call. python probe.py OUT"""
import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx

import gpu_e2e_bench as e2e
import gpu_step_profile as sp

KERNELS = ("skinny", "partial", "split_heads", "arg_reduce")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    limit = mx.set_cache_limit(1 << 50)      # the default, read back
    mx.set_cache_limit(limit)
    reads, first = [], None
    for name in ("cached", "uncached", "uncached", "cached"):
        e2e.warm_up(loaded, batch, args.block_size, args.shared)
        mx.clear_cache()
        mx.set_cache_limit(0 if name == "uncached" else limit)
        arm = sp.profile_arm(loaded, batch, args, True, bandwidth, weights)
        mx.set_cache_limit(limit)
        tokens = arm.pop("tokens")
        first = first or tokens
        spread = {k: v for k, v in arm["kernel_us_median_max"].items() if any(p in k for p in KERNELS)}
        reads.append({"state": name, "wall_ms": arm["wall_ms"], "host_ms": arm["host_ms"],
                      "encode_ms": arm["encode_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"],
                      "kernels": {k: v for k, v in arm["kernels_by_name_per_step"].items()
                                  if any(p in k for p in KERNELS)},
                      "spread_us": spread, "longest_us": arm.get("longest_kernels_us"),
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
        (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| state | step ms | host ms | encode ms | GPU ms | slowest calls (us) | rows agree |",
             "|---|---|---|---|---|---|---|"]
    for r in reads:
        slowest = ", ".join(f"{round(us)}" for _, us in (r["longest_us"] or [])[:6])
        lines.append(f"| {r['state']} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['encode_ms']:.2f} "
                     f"| {r['gpu_ms']:.2f} | {slowest} | {r['tokens_agree']['identical_rows']}/"
                     f"{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
