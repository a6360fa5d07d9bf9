"""The partial kernel's staging before (910c925: slot checks in every chunk, 64-bit products a copy) and after
(main), and main with each score tile's k-steps summed in two chains (variant.py), side by side in one process:
gpu_step_profile's cascade arm in the order old, new, split, split, new, old, then the flat arm old, new. Each
read's tokens are checked against the first read of its arm. cuda_910c925.py beside this file is
`git show 910c925:kernels/cuda.py` (run.sh says how). python probe.py OUT"""
import argparse
import ast
import dataclasses
import json
import os
import sys
from pathlib import Path

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.kernels import cuda

import variant

HERE = Path(__file__).parent
KERNELS = ("skinny", "partial", "split_heads", "merge")


def partial_source_of(path: Path) -> str:
    tree = ast.parse(path.read_text())
    return next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "PARTIAL_SOURCE")


SOURCES = {"old": partial_source_of(HERE / "cuda_910c925.py"), "new": cuda.PARTIAL_SOURCE,
           "split": variant.split_chains(cuda.PARTIAL_SOURCE)}


def use(name: str) -> None:
    library = cuda.HEADER + "".join(
        f"namespace mlxcel {{\n{signature} {{\n{body}}}\n}}  // namespace mlxcel\n"
        for signature, body in ((cuda.PARTIAL_SIGNATURE, SOURCES[name]), (cuda.MERGE_SIGNATURE, cuda.MERGE_SOURCE),
                                (cuda.CASCADE_MERGE_SIGNATURE, cuda.CASCADE_MERGE_SOURCE)))
    cuda.KERNELS.platform = dataclasses.replace(cuda.KERNELS.platform, header=library)
    cuda.KERNELS._kernels.clear()


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    assert cuda.LIBRARY == cuda.KERNELS.platform.header   # the swap rebuilds the library as cuda.py does
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    e2e.warm_up(loaded, batch, args.block_size, args.shared)
    reads, first = [], {}
    order = [(n, True) for n in ("old", "new", "split", "split", "new", "old")] + [("old", False), ("new", False)]
    for name, cascade in order:
        use(name)
        arm = sp.profile_arm(loaded, batch, args, cascade, bandwidth, weights)
        tokens = arm.pop("tokens")
        first.setdefault(cascade, tokens)
        kernels = {k: [round(c, 1), round(ms, 3)] for k, (c, ms) in arm["kernels_by_name_per_step"].items()
                   if any(part in k for part in KERNELS)}
        reads.append({"source": name, "cascade": cascade, "wall_ms": arm["wall_ms"],
                      "gpu_ms": arm["gpu_busy_ms_per_step"], "kernels": kernels,
                      "tokens_agree": e2e.agreement(first[cascade], tokens)})
        print(json.dumps(reads[-1]), flush=True)
    (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| arm | source | step ms | GPU ms | level 0 ms | private/flat partial ms | rows agree |",
             "|---|---|---|---|---|---|---|"]
    for r in reads:
        partial = [ms for k, (c, ms) in r["kernels"].items() if "partial" in k]
        level0 = [ms for k, (c, ms) in r["kernels"].items() if "partial" in k and "_t_" in k.split("128_32_")[-1][:4]]
        lines.append(f"| {'cascade' if r['cascade'] else 'flat'} | {r['source']} | {r['wall_ms']:.2f} "
                     f"| {r['gpu_ms']:.2f} | {sum(level0):.3f} | {sum(partial) - sum(level0):.3f} "
                     f"| {r['tokens_agree']['identical_rows']}/{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
