"""Where a decode step's host-written arrays should live, in one process: gpu_step_profile's cascade arm
in the order prefetch, remote, read-mostly, read-mostly, remote, prefetch. "prefetch": main (moved to the
GPU when made, kernels/managed.py); "remote": advised to stay on the host, mapped for the GPU's reads
(cuMemAdvise preferred location host, accessed by the GPU: no migration either way); "read-mostly":
advised read-mostly, then prefetched (the GPU reads a copy, the host keeps its own). Each read's tokens
are checked against the first read's. python probe.py OUT"""
import argparse
import ctypes
import json
import sys
from pathlib import Path

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.kernels import managed

KERNELS = ("skinny", "partial", "split_heads")
READ_MOSTLY, PREFERRED_LOCATION, ACCESSED_BY = 1, 3, 5
HOST = managed.MemLocation(2, 0)


class Advised:
    def __init__(self, prefetch: managed.Prefetcher, advice: str) -> None:
        self.prefetch, self.advice, self.enabled = prefetch, advice, True
        self.advise = prefetch.driver.cuMemAdvise_v2
        self.advise.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, managed.MemLocation]

    def __call__(self, address: int, size: int) -> None:
        p = self.prefetch
        if self.advice == "remote":
            p._check(self.advise(address, size, PREFERRED_LOCATION, HOST), "advise")
            p._check(self.advise(address, size, ACCESSED_BY, p.location), "advise")
        else:
            p._check(self.advise(address, size, READ_MOSTLY, p.location), "advise")
            p(address, size)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    base = managed.prefetcher()
    states = {"prefetch": base, "remote": Advised(base, "remote"), "read-mostly": Advised(base, "read-mostly")}
    reads, first = [], None
    for name in ("prefetch", "remote", "read-mostly", "read-mostly", "remote", "prefetch"):
        managed.prefetcher = lambda state=states[name]: state
        e2e.warm_up(loaded, batch, args.block_size, args.shared)
        arm = sp.profile_arm(loaded, batch, args, True, bandwidth, weights)
        tokens = arm.pop("tokens")
        first = first or tokens
        kernels = {k: [round(c, 1), round(ms, 3)] for k, (c, ms) in arm["kernels_by_name_per_step"].items()
                   if any(part in k for part in KERNELS)}
        reads.append({"state": name, "enabled": states[name].enabled, "wall_ms": arm["wall_ms"],
                      "host_ms": arm["host_ms"], "encode_ms": arm["encode_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"],
                      "kernels_per_step": arm["kernels_per_step"], "kernels": kernels,
                      "spread_us": arm.get("kernel_us_median_max"), "longest_us": arm.get("longest_kernels_us"),
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
    (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| state | step ms | host ms | encode ms | GPU ms | split ms (max us) | private ms (max us) "
             "| level 0 ms (max us) | rows agree |", "|---|---|---|---|---|---|---|---|---|"]
    for r in reads:
        cells = []
        for part in ("split_heads", "merged_partial", "warpgroup_partial"):
            name = next(k for k in r["kernels"] if part in k)
            cells.append(f"{r['kernels'][name][1]:.3f} ({r['spread_us'][name][1]:.0f})")
        state = r["state"] + ("" if r["enabled"] else " (failed: faults)")
        lines.append(f"| {state} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['encode_ms']:.2f} "
                     f"| {r['gpu_ms']:.2f} | " + " | ".join(cells)
                     + f" | {r['tokens_agree']['identical_rows']}/{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
