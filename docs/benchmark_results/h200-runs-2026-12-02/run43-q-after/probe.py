"""Three states of the attention kernels side by side in one process, gpu_step_profile's cascade arm in the
order before, fold, after, after, fold, before: "before" commit a26c1d1's kernels/cuda.py and cuda_warpgroup.py
(kept beside this file as cuda_before.py and cuda_warpgroup_before.py), "fold" the warp-cooperative fold of
the levels' states (commit cf52f64's cuda.py, as cuda_fold.py), "after" the working tree: the fold, and the
partial and warpgroup kernels' Q loaded once the first chunks' copies are issued. Each read's tokens are
checked against the first read's. python probe.py OUT"""
import argparse
import importlib.util
import json
import sys
from pathlib import Path

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.kernels import cuda

KERNELS = ("skinny", "partial", "split_heads", "merge")


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"mlxcel.kernels.{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    load("cuda_warpgroup_before")
    platforms = {"before": load("cuda_before").KERNELS.platform, "fold": load("cuda_fold").KERNELS.platform,
                 "after": cuda.KERNELS.platform}
    compiled = {name: {} for name in platforms}     # each platform's kernels (the cache is keyed by kind)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    reads, first = [], None
    for name in ("before", "fold", "after", "after", "fold", "before"):
        cuda.KERNELS.platform, cuda.KERNELS._kernels = platforms[name], compiled[name]
        for layer in loaded.model.layers:
            layer.halves.forget_traces()          # a layer's traces hold the kernels they were traced with
        e2e.warm_up(loaded, batch, args.block_size, args.shared)
        arm = sp.profile_arm(loaded, batch, args, True, bandwidth, weights)
        tokens = arm.pop("tokens")
        first = first or tokens
        kernels = {k: [round(c, 1), round(ms, 3)] for k, (c, ms) in arm["kernels_by_name_per_step"].items()
                   if any(part in k for part in KERNELS)}
        reads.append({"kernels_state": name, "wall_ms": arm["wall_ms"], "host_ms": arm["host_ms"],
                      "encode_ms": arm["encode_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"],
                      "kernels_per_step": arm["kernels_per_step"], "kernels": kernels,
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
    (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| kernels | step ms | host ms | encode ms | GPU ms | kernels | merged private ms | level 0 ms | rows agree |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in reads:
        private = sum(ms for k, (c, ms) in r["kernels"].items() if "merged_partial" in k)
        level0 = sum(ms for k, (c, ms) in r["kernels"].items() if "warpgroup_partial" in k)
        lines.append(f"| {r['kernels_state']} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['encode_ms']:.2f} "
                     f"| {r['gpu_ms']:.2f} | {r['kernels_per_step']:.0f} | {private:.3f} | {level0:.3f} "
                     f"| {r['tokens_agree']['identical_rows']}/{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
