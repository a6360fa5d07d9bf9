"""The cascade step with the o_proj weight started into the L2 cache by the head split (MLXCEL_L2_PREFETCH:
normal or last, the bulk prefetch's eviction priority) against none: gpu_step_profile's cascade arm, the
three in the order A B C C B A in one process, each read's tokens checked against the first read's.
The prefetch was the code of commit 0b1884a (reverted after this run). python probe.py OUT"""
import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import gpu_e2e_bench as e2e
import gpu_step_profile as sp

POLICIES = ["none", "normal", "last"]
KERNELS = ("skinny", "partial", "split_heads", "merge")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    e2e.warm_up(loaded, batch, args.block_size, args.shared)
    reads, first_tokens = [], None
    for policy in POLICIES + POLICIES[::-1]:
        os.environ["MLXCEL_L2_PREFETCH"] = policy
        arm = sp.profile_arm(loaded, batch, args, True, bandwidth, weights)
        tokens = arm.pop("tokens")
        first_tokens = first_tokens or tokens
        kernels = {name: [round(c, 1), round(ms, 3)] for name, (c, ms) in arm["kernels_by_name_per_step"].items()
                   if any(k in name for k in KERNELS)}
        reads.append({"policy": policy, "wall_ms": arm["wall_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"],
                      "tokens_per_s": arm["tokens_per_s"], "kernels": kernels,
                      "tokens_agree": e2e.agreement(first_tokens, tokens)})
        print(json.dumps(reads[-1]), flush=True)
    (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| policy | step ms | GPU ms | tok/s |", "|---|---|---|---|"]
    lines += [f"| {r['policy']} | {r['wall_ms']:.2f} | {r['gpu_ms']:.2f} | {r['tokens_per_s']:.0f} |" for r in reads]
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    best = min(POLICIES, key=lambda p: statistics.median(r["wall_ms"] for r in reads if r["policy"] == p))
    (out / "best").write_text(best)


if __name__ == "__main__":
    main()
