"""The cascade's private level beside level 0 on a second GPU stream, in one process: gpu_step_profile's
cascade arm in the order merging, two streams, two streams, merging. "merging": main (the private level
merges the levels' states after level 0); "two streams": the private level on its own on a second stream
(mx.new_stream), so it can run while level 0 does, and the cascade merge launch after both. Each read's tokens are checked against
the first read's. python probe.py OUT"""
import argparse
import dataclasses
import json
import sys
from pathlib import Path

import mlx.core as mx

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.kernels import cuda, fused

KERNELS = ("skinny", "partial", "split_heads", "merge")
SIDE = mx.new_stream(mx.gpu)
ONE_STREAM = fused.FusedCascade.__call__


def two_streams(self, q, k_pool, v_pool, last_page_len):
    k = self.kernels
    with mx.stream(SIDE):
        op, lsep = k.run_partial(self.private, q, k_pool, v_pool, self.private_indices, last_page_len,
                                 self.geometry_private)
    states = []
    for level in self.levels:
        states += k.run_partial(level.launch, q, k_pool, v_pool, level.view.indices, level.view.last_page_len,
                                level.geometry, level.members)
    states += [k.no_level] * (2 * (fused.MAX_DEPTH - len(self.levels)))
    return self.merge([op, lsep, self.indptr_private, *states, self.level_map], k.poison)[0]


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    merging = cuda.KERNELS.platform
    apart = dataclasses.replace(merging, merged_partial_source="", merged_quantized_partial_source="")
    states = {"merging": (merging, ONE_STREAM), "merge launch": (apart, ONE_STREAM),
              "two streams": (apart, two_streams)}
    compiled = {name: {} for name in states}
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    reads, first = [], None
    for name in ("merging", "two streams", "two streams", "merging"):
        platform, call = states[name]
        cuda.KERNELS.platform, cuda.KERNELS._kernels = platform, compiled[name]
        fused.FusedCascade.__call__ = call
        for layer in loaded.model.layers:
            layer.halves.forget_traces()
        e2e.warm_up(loaded, batch, args.block_size, args.shared)
        arm = sp.profile_arm(loaded, batch, args, True, bandwidth, weights)
        tokens = arm.pop("tokens")
        first = first or tokens
        kernels = {k: [round(c, 1), round(ms, 3)] for k, (c, ms) in arm["kernels_by_name_per_step"].items()
                   if any(part in k for part in KERNELS)}
        reads.append({"state": name, "wall_ms": arm["wall_ms"], "host_ms": arm["host_ms"],
                      "encode_ms": arm["encode_ms"], "gpu_ms": arm["gpu_busy_ms_per_step"],
                      "kernels_per_step": arm["kernels_per_step"], "kernels": kernels,
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
    (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| state | step ms | host ms | encode ms | GPU ms (sum) | kernels | private ms | level 0 ms | rows agree |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in reads:
        private = sum(ms for k, (c, ms) in r["kernels"].items() if "partial" in k and "warpgroup" not in k)
        level0 = sum(ms for k, (c, ms) in r["kernels"].items() if "warpgroup_partial" in k)
        lines.append(f"| {r['state']} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['encode_ms']:.2f} "
                     f"| {r['gpu_ms']:.2f} | {r['kernels_per_step']:.0f} | {private:.3f} | {level0:.3f} "
                     f"| {r['tokens_agree']['identical_rows']}/{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
