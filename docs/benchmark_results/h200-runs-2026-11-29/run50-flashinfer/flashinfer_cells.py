"""FlashInfer's MultiLevelCascadeAttentionWrapper beside the fused cascade and MLX SDPA, same cells, same process.

Each cell's K/V pools, queries and page tables are the bench's (gpu_attention_bench.Cell), copied to torch. Level 0:
all B query rows as one request over the shared pages; level 1: each row's 8 private pages. Outputs are compared to
our cascade step before timing. Timings per call: FlashInfer by CUDA events over N back-to-back runs (host launch
overhead included where it exceeds the GPU's) and by CUPTI (GPU busy time, union of kernel intervals); ours and
SDPA by the bench's slope and by CUPTI over chained calls (gpu_timeline). Usage: flashinfer_cells.py OUT S1xB1,...
"""
import json, sys, time
import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
import mlx.core as mx
import gpu_attention_bench as b
import gpu_timeline as tl
from flashinfer.cascade import MultiLevelCascadeAttentionWrapper

out_dir = sys.argv[1]
cells = [tuple(int(x) for x in c.split("x")) for c in sys.argv[2].split(",")]
BACKEND = sys.argv[3] if len(sys.argv) > 3 else "auto"
N = 100
ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def to_torch(a):
    return torch.from_numpy(np.array(a.astype(mx.float32))).to("cuda", torch.bfloat16)


def cupti_busy(fn, n):
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            fn(i)
        torch.cuda.synchronize()
    path = "/tmp/fi_trace.json"
    prof.export_chrome_trace(path)
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    names = sorted({e["name"].split("(")[0][:90] for e in ev})
    return tl.union_length([(e["ts"], e["ts"] + e["dur"]) for e in ev]) / n, len(ev) / n, names


report = []
for S, B in cells:
    cell = b.Cell(S, 256, B)
    sp, tp = S // 32, 8
    ks, vs, qs = [to_torch(k) for k in cell.k_pools], [to_torch(v) for v in cell.v_pools], [to_torch(q) for q in cell.queries]
    i32 = dict(dtype=torch.int32)
    w = MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
    if BACKEND != "auto":   # every level's prefill wrapper on the named backend
        from flashinfer.prefill import BatchPrefillWithPagedKVCacheWrapper
        w._batch_prefill_wrappers = [BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=BACKEND) for _ in range(2)]
    t0 = time.time()
    w.plan([torch.tensor([0, B], **i32), torch.arange(B + 1, **i32)],
           [torch.tensor([0, sp], **i32), torch.arange(B + 1, **i32) * tp],
           [torch.arange(sp, **i32), sp + torch.arange(B * tp, **i32)],
           [torch.tensor([32], **i32), torch.full((B,), 32, **i32)],
           32, 8, 128, 32, causal=False, sm_scale=cell.scale, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)

    def fi(i):
        s = i % cell.sets
        return w.run(qs[s], (ks[s], vs[s]))
    got = fi(0)
    torch.cuda.synchronize()
    first_s = time.time() - t0
    ours = np.array(cell.cascade(0).astype(mx.float32), np.float64)
    theirs = got.float().cpu().numpy().astype(np.float64)
    err = float(np.linalg.norm(theirs - ours) / np.linalg.norm(ours))
    for i in range(10):
        fi(i)
    torch.cuda.synchronize()
    events = []
    for rep in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(N):
            fi(i)
        end.record()
        torch.cuda.synchronize()
        events.append(start.elapsed_time(end) / N * 1e3)
    fi_busy, fi_kernels, fi_names = cupti_busy(fi, N)
    sdpa = cell.sdpa_call()
    arms = {"sdpa": sdpa, "cascade": cell.cascade}
    slope = b.measure_all(arms, 10)
    busy = {}
    for name, call in arms.items():
        b.chain(call, N)
        mx.synchronize()
        busy[name] = tl.summarize(N, *tl.traced_chain(call, N))["busy_us_per_call"]
    r = {"shared": S, "batch": B, "fi_vs_ours_rel_err": err, "fi_first_call_s": first_s,
         "fi_events_us": sorted(events)[len(events) // 2], "fi_busy_us": fi_busy, "fi_kernels_per_call": fi_kernels,
         "fi_kernels": fi_names, "ours_slope_us": slope["cascade"]["s"] * 1e6, "sdpa_slope_us": slope["sdpa"]["s"] * 1e6,
         "ours_busy_us": busy["cascade"], "sdpa_busy_us": busy["sdpa"]}
    report.append(r)
    print(json.dumps(r), flush=True)
lines = [f"FlashInfer MultiLevelCascadeAttentionWrapper (backend {BACKEND}) beside ours and MLX SDPA; us per call", "",
         "| S x B | FI events | FI GPU busy | ours slope | ours GPU busy | SDPA slope | SDPA GPU busy | FI busy / ours busy | rel. err FI vs ours |",
         "|---|---|---|---|---|---|---|---|---|"]
for r in report:
    lines.append(f"| {r['shared']} x {r['batch']} | {r['fi_events_us']:.1f} | {r['fi_busy_us']:.1f} | {r['ours_slope_us']:.1f} "
                 f"| {r['ours_busy_us']:.1f} | {r['sdpa_slope_us']:.1f} | {r['sdpa_busy_us']:.1f} "
                 f"| {r['fi_busy_us'] / r['ours_busy_us']:.2f} | {r['fi_vs_ours_rel_err']:.1e} |")
open(f"{out_dir}/flashinfer.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
