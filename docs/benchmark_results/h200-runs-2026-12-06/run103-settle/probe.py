"""The engine's decode step with its uploads' prefetches waited for before the step is enqueued
(managed.settle) against the same step without the wait, in one process: gpu_step_profile's arm in the order
settle, none, none, settle (cascade). Tokens checked against the first read's; each read lists
the step's wall (median, mean, max over its full-batch steps) and the kernels whose slowest call in the
profiled window took over 100 us (median / max). python probe.py OUT"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.kernels import managed


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    reads, first = [], {}
    for cascade in (True,):
        for state in ("settle", "none", "none", "settle"):
            managed.SETTLE = state == "settle"
            e2e.warm_up(loaded, batch, args.block_size, args.shared)
            arm = sp.profile_arm(loaded, batch, args, cascade, None, bandwidth, weights)
            tokens = arm.pop("tokens")
            first.setdefault(cascade, tokens)
            walls = arm["wall_ms_each"]
            slow = {name: [round(v, 1) for v in us] for name, us in arm["kernel_us_median_max"].items()
                    if us[1] > 100}
            reads.append({"arm": "cascade" if cascade else "flat", "state": state, "tok_s": arm["tokens_per_s"],
                          "wall_ms": arm["wall_ms"], "wall_mean_ms": statistics.mean(walls), "wall_max_ms": max(walls),
                          "host_ms": arm["host_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"], "slow_kernels": slow,
                          "tokens_agree": e2e.agreement(first[cascade], tokens)})
            print(json.dumps(reads[-1]), flush=True)
            (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| arm | state | tok/s | step ms (median, mean, max) | host ms | GPU ms | kernels over 100 us "
             "(median / max) | rows agree |", "|---|---|---|---|---|---|---|---|"]
    for r in reads:
        slow = ", ".join(f"{n[:40]}: {m} / {x}" for n, (m, x) in r["slow_kernels"].items())
        lines.append(f"| {r['arm']} | {r['state']} | {r['tok_s']:.0f} | {r['wall_ms']:.2f}, {r['wall_mean_ms']:.2f}, "
                     f"{r['wall_max_ms']:.2f} | {r['host_ms']:.2f} | {r['gpu_ms']:.2f} | {slow} "
                     f"| {r['tokens_agree']['identical_rows']}/{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
