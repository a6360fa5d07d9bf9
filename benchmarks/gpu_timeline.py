"""GPU-side timeline of chained decode-attention calls, from the GPU's own timestamps.

    python benchmarks/gpu_timeline.py --out OUTDIR [--shared 8192 --batch 32 --calls 100]

gpu_attention_bench.py times calls with the host's clock around
mx.async_eval + mx.synchronize. This tool reads the GPU's: it records each
method's chain of calls (as the bench builds it) under PyTorch's profiler,
whose CUPTI activity tracing sees every kernel in the process, MLX's CUDA
graphs' included (nsys is not on the H200 machine; PyTorch is). Per method:
the kernels per call, the GPU's busy time per call (union of kernel
intervals, so concurrent kernels count once), the span from the first kernel's
start to the last one's end per call, the idle time inside that span, how long
after the encode began the first kernel started, and each kernel's median
duration (level 0 and level 1 of the cascade are told apart by grid). The
profiler adds host time to every launch, so the wall figures here read slower
than the bench's; the kernel figures are the GPU's.

Needs CUDA and an importable torch; writes timeline.json and timeline.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path

import mlx.core as mx

import gpu_attention_bench as bench


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def complete_events(prof) -> list[dict]:
    """A finished torch.profiler session's complete ("X") trace events, kernels and annotations alike."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return [e for e in json.load(open(f.name))["traceEvents"] if e.get("ph") == "X"]


def traced_chain(call, n: int) -> tuple[dict, list[dict]]:
    """n chained calls under the profiler: host-clock figures and the trace's complete events."""
    from torch.profiler import ProfilerActivity, profile, record_function  # CUPTI; imported where it runs

    mx.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        begin = time.perf_counter()
        out = bench.chain(call, n)
        built = time.perf_counter()
        with record_function("encode"):
            mx.async_eval(out)
        encoded = time.perf_counter()
        mx.synchronize()
        done = time.perf_counter()
    return {"wall_us": (done - built) / n * 1e6, "encode_us": (encoded - built) / n * 1e6,
            "build_us": (built - begin) / n * 1e6}, complete_events(prof)


def summarize(n: int, timing: dict, events: list[dict]) -> dict:
    kernels = sorted((e["ts"], e["ts"] + e["dur"], e["name"], tuple(e.get("args", {}).get("grid", ())))
                     for e in events if e.get("cat") == "kernel")
    encode = next((e["ts"] for e in events if e.get("cat") == "user_annotation" and e["name"] == "encode"), None)
    first, last = kernels[0][0], max(k[1] for k in kernels)
    busy = union_length([(s, e) for s, e, _, _ in kernels])
    durations = collections.defaultdict(list)
    for start, stop, name, grid in kernels:
        # Custom kernels' names carry their template constants (level 0 is STACKED "_t_", level 1 "_f_").
        short = name.split("(")[0].replace("void ", "").replace("mlx::core::cu::", "").replace("custom_kernel_", "")
        durations[f"{short[:96]} grid {list(grid)}"].append(stop - start)
    return {**timing, "calls": n, "kernels_per_call": len(kernels) / n, "busy_us_per_call": busy / n,
            "span_us_per_call": (last - first) / n, "idle_us_per_call": (last - first - busy) / n,
            "first_kernel_after_encode_us": None if encode is None else first - encode,
            "kernel_median_us": {k: statistics.median(v) for k, v in durations.items()},
            "kernel_count": {k: len(v) for k, v in durations.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shared", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tail", type=int, default=256)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    cell = bench.Cell(args.shared, args.tail, args.batch)
    methods = {"chain": cell.chain_only, "sdpa": cell.sdpa_call(), "flat": cell.flat, "cascade": cell.cascade}
    for call in methods.values():
        for i in range(3):
            mx.eval(call(i, None))
    rounds = []
    for _ in range(args.rounds):
        result = {}
        for name, call in methods.items():
            bench.chain(call, args.calls)          # unprofiled warm chain
            mx.synchronize()
            result[name] = summarize(args.calls, *traced_chain(call, args.calls))
            print(name, json.dumps({k: round(v, 2) for k, v in result[name].items() if isinstance(v, float)}),
                  flush=True)
        rounds.append(result)
    report = {"shared": args.shared, "batch": args.batch, "tail": args.tail, "device": bench.device_name(),
              "rounds": rounds}
    (args.out / "timeline.json").write_text(json.dumps(report, indent=1))
    lines = [f"S={args.shared} B={args.batch}, {args.calls} chained calls a method, {bench.device_name()}", "",
             "| round | method | wall us/call (profiled) | GPU busy us/call | GPU span us/call | idle us/call "
             "| kernels/call | SDPA busy / this |", "|---|---|---|---|---|---|---|---|"]
    for i, result in enumerate(rounds):
        for name, r in result.items():
            lines.append(f"| {i + 1} | {name} | {r['wall_us']:.1f} | {r['busy_us_per_call']:.1f} "
                         f"| {r['span_us_per_call']:.1f} | {r['idle_us_per_call']:.1f} | {r['kernels_per_call']:.2f} "
                         f"| {result['sdpa']['busy_us_per_call'] / r['busy_us_per_call']:.2f} |")
    lines += ["", "Kernel medians (us), last round:", ""]
    for name, r in rounds[-1].items():
        lines += [f"- {name}: " + "; ".join(f"{k} x{r['kernel_count'][k]}: {v:.2f}"
                                             for k, v in r["kernel_median_us"].items())]
    (args.out / "timeline.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
