"""FlashInfer's MultiLevelCascadeAttentionWrapper beside the fused cascade and MLX SDPA, in one process.

    python benchmarks/gpu_flashinfer_bench.py --out OUTDIR [--cells 8192x32,2048x64,32768x32,8192x4]

Needs CUDA, torch and FlashInfer (scripts/flashinfer_bundle.sh builds a bundle
the offline H200 machine can carry; its JIT compiles the batch-prefill and
cascade modules with the machine's nvcc on first use, ~40 s). Every cell is
gpu_attention_bench's: the same K/V pools, queries and page tables, copied to
torch. FlashInfer's two levels: level 0 is all B query rows as one request
over the shared pages, level 1 each row's private pages; its prefill kernels
serve both, merge_state folds them. Its output is compared to ours first.

Per call: FlashInfer by CUDA events around N back-to-back runs (its Python
launch path included where it is longer than the GPU's work) and by its GPU
busy time (CUPTI kernel timestamps through torch.profiler, union of kernel
intervals); ours and SDPA by gpu_attention_bench's slope and by the same GPU
busy time over chained calls (gpu_timeline). The GPU busy times are the
like-for-like figure.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import torch
from flashinfer.cascade import MultiLevelCascadeAttentionWrapper
from torch.profiler import ProfilerActivity, profile

import gpu_attention_bench as bench
import gpu_timeline as timeline

CALLS = 100
WORKSPACE_BYTES = 256 << 20


def to_torch(a: mx.array) -> torch.Tensor:
    return torch.from_numpy(np.array(a.astype(mx.float32))).to("cuda", torch.bfloat16)


def gpu_busy(run, n: int) -> tuple[float, float]:
    """(GPU busy us per call, kernels per call) of n back-to-back runs."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            run(i)
        torch.cuda.synchronize()
    kernels = [e for e in timeline.complete_events(prof) if e.get("cat") == "kernel"]
    return timeline.union_length([(e["ts"], e["ts"] + e["dur"]) for e in kernels]) / n, len(kernels) / n


def event_us(run, n: int, reps: int = 10) -> float:
    """Median over reps of n back-to-back runs timed by CUDA events, us per run."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(n):
            run(i)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / n * 1e3)
    return sorted(times)[reps // 2]


def flashinfer_run(cell: bench.Cell, workspace: torch.Tensor):
    """A planned two-level wrapper over the cell's pools; run(i) uses the cell's i-th input set."""
    shared_pages, tail_pages, rows = cell.shared // bench.BLOCK, cell.tail // bench.BLOCK, cell.batch
    k, v, q = ([to_torch(a) for a in arrays] for arrays in (cell.k_pools, cell.v_pools, cell.queries))
    i32 = dict(dtype=torch.int32)
    wrapper = MultiLevelCascadeAttentionWrapper(2, workspace, "NHD")
    wrapper.plan([torch.tensor([0, rows], **i32), torch.arange(rows + 1, **i32)],
                 [torch.tensor([0, shared_pages], **i32), torch.arange(rows + 1, **i32) * tail_pages],
                 [torch.arange(shared_pages, **i32), shared_pages + torch.arange(rows * tail_pages, **i32)],
                 [torch.tensor([bench.BLOCK], **i32), torch.full((rows,), bench.BLOCK, **i32)],
                 bench.HQ, bench.HKV, bench.D, bench.BLOCK, causal=False, sm_scale=cell.scale,
                 q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    return lambda i: wrapper.run(q[i % cell.sets], (k[i % cell.sets], v[i % cell.sets]))


def run_cell(shared: int, batch: int, reps: int, workspace: torch.Tensor) -> dict:
    cell = bench.Cell(shared, 256, batch)
    start = time.perf_counter()
    run = flashinfer_run(cell, workspace)
    theirs = run(0).float().cpu().numpy().astype(np.float64)
    first_call_s = time.perf_counter() - start                 # JIT builds on the first cell
    ours = np.array(cell.cascade(0).astype(mx.float32), np.float64)
    for i in range(10):
        run(i)
    fi_busy, fi_kernels = gpu_busy(run, CALLS)
    arms = {"sdpa": cell.sdpa_call(), "cascade": cell.cascade}
    slopes = bench.measure_all(arms, reps)
    busy = {}
    for name, call in arms.items():
        bench.chain(call, CALLS)
        mx.synchronize()
        busy[name] = timeline.summarize(CALLS, *timeline.traced_chain(call, CALLS))["busy_us_per_call"]
    return {"shared": shared, "batch": batch,
            "flashinfer_vs_ours_rel_err": float(np.linalg.norm(theirs - ours) / np.linalg.norm(ours)),
            "flashinfer_first_call_s": first_call_s, "flashinfer_events_us": event_us(run, CALLS),
            "flashinfer_busy_us": fi_busy, "flashinfer_kernels_per_call": fi_kernels,
            "ours_slope_us": slopes["cascade"]["s"] * 1e6, "ours_busy_us": busy["cascade"],
            "sdpa_slope_us": slopes["sdpa"]["s"] * 1e6, "sdpa_busy_us": busy["sdpa"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cells", default="8192x32,2048x64,32768x32,8192x4", help="SHAREDxBATCH,...")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    results = []
    for cell in args.cells.split(","):
        shared, batch = (int(x) for x in cell.split("x"))
        results.append(run_cell(shared, batch, args.reps, workspace))
        print(json.dumps(results[-1]), flush=True)
    (args.out / "flashinfer_bench.json").write_text(json.dumps({"device": bench.device_name(), "cells": results},
                                                               indent=1))
    lines = [f"FlashInfer MultiLevelCascadeAttentionWrapper beside the fused cascade and MLX SDPA, us per call, "
             f"{bench.device_name()}", "",
             "| S x B | FlashInfer events | FlashInfer GPU busy | ours slope | ours GPU busy | SDPA slope "
             "| SDPA GPU busy | FlashInfer busy / ours | rel. err FlashInfer vs ours |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['shared']} x {r['batch']} | {r['flashinfer_events_us']:.1f} | {r['flashinfer_busy_us']:.1f} "
              f"| {r['ours_slope_us']:.1f} | {r['ours_busy_us']:.1f} | {r['sdpa_slope_us']:.1f} "
              f"| {r['sdpa_busy_us']:.1f} | {r['flashinfer_busy_us'] / r['ours_busy_us']:.2f} "
              f"| {r['flashinfer_vs_ours_rel_err']:.1e} |" for r in results]
    (args.out / "flashinfer_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
