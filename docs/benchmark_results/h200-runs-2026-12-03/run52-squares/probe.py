"""gate/up's looping launch summing the rows' squares in a block's first tile only, against main's kernel
(every tile, cuda_matmul_main.py.txt: kernels/cuda_matmul.py at 2213b6f, loaded beside the new one), in one
process: gpu_step_profile's cascade arm in the order main, once, once, main. Each read's tokens are checked
against the first read's. python probe.py OUT Ran at 9709d44 (since backed out)."""
import argparse
import importlib.util
import json
import sys
from pathlib import Path

import gpu_e2e_bench as e2e
import gpu_step_profile as sp
from mlxcel.kernels import cuda_layer_ops, cuda_matmul

KERNELS = ("skinny", "partial", "split_heads")


def main_module():
    source = (Path(__file__).parent / "cuda_matmul_main.py.txt").read_text()
    spec = importlib.util.spec_from_loader("mlxcel.kernels.cuda_matmul_main", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "mlxcel.kernels"
    sys.modules[spec.name] = module          # its dataclasses look their module up
    exec(compile(source, "cuda_matmul_main.py", "exec"), module.__dict__)
    return module


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    modules = {"main": main_module(), "once": cuda_matmul}
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=96, block_size=32, shared=8192, profile_steps=10, skip_steps=8)
    bandwidth, weights = sp.copy_bandwidth(1024), sp.weight_bytes(loaded)
    reads, first = [], None
    for name in ("main", "once", "once", "main"):
        cuda_layer_ops.cuda_matmul = modules[name]
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
                      "walls_last_32": arm["wall_ms_each"][-32:], "kernels_per_step": arm["kernels_per_step"],
                      "kernels": kernels, "spread_us": arm.get("kernel_us_median_max"),
                      "tokens_agree": e2e.agreement(first, tokens)})
        print(json.dumps(reads[-1]), flush=True)
        (out / "probe.json").write_text(json.dumps(reads, indent=1))
    lines = ["| state | step ms | host ms | encode ms | GPU ms | skinny ms | gate/up ms (median us) | rows agree |",
             "|---|---|---|---|---|---|---|---|"]
    for r in reads:
        skinny = sum(ms for k, (_, ms) in r["kernels"].items() if "skinny" in k)
        gate_up = next(k for k in r["kernels"] if "skinny" in k and "_193152_" in k)
        lines.append(f"| {r['state']} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} | {r['encode_ms']:.2f} "
                     f"| {r['gpu_ms']:.2f} | {skinny:.3f} | {r['kernels'][gate_up][1]:.3f} "
                     f"({r['spread_us'][gate_up][0]:.1f}) "
                     f"| {r['tokens_agree']['identical_rows']}/{r['tokens_agree']['rows']} |")
    (out / "probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
