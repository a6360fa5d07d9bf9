"""GPU timeline of the bench's chained calls at one cell, from CUPTI through torch.profiler (nsys is not on
the machine): per arm, the wall time per call, the kernels' busy time (union of intervals) per call, the idle
gaps, where the first kernel starts relative to the encode, and the CUDA runtime calls MLX makes (graph
launches, updates). Usage: python3 kineto_step.py OUT [S B N]"""
import collections, gzip, json, os, statistics, sys, time
import torch
from torch.profiler import profile, ProfilerActivity, record_function
import mlx.core as mx
import gpu_attention_bench as b

out = sys.argv[1]
S, B, N = (int(x) for x in (sys.argv[2:5] or (8192, 32, 100)))
cell = b.Cell(S, 256, B)
sdpa = cell.sdpa_call()
arms = {"chain": cell.chain_only, "sdpa": sdpa, "cascade": cell.cascade, "flat": cell.flat}
for name, call in arms.items():
    for i in range(3):
        mx.eval(call(i))
mx.synchronize()


def one(name, call):
    mx.synchronize()
    with record_function("build"):
        t0 = time.perf_counter()
        o = b.chain(call, N)
        t1 = time.perf_counter()
    with record_function("encode"):
        mx.async_eval(o)
        t2 = time.perf_counter()
    with record_function("sync"):
        mx.synchronize()
        t3 = time.perf_counter()
    return {"wall_us": (t3 - t1) / N * 1e6, "encode_us": (t2 - t1) / N * 1e6, "build_us": (t1 - t0) / N * 1e6}


def union(intervals):
    total, end = 0.0, -1e30
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


summary = {}
for rep in range(2):
    for name, call in arms.items():
        one(name, call)  # unprofiled warm repeat
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            timing = one(name, call)
        path = f"/tmp/trace_{name}_{rep}.json"
        prof.export_chrome_trace(path)
        ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
        ann = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "user_annotation"}
        kern = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in ev if e.get("cat") == "kernel")
        rt = collections.defaultdict(list)
        for e in ev:
            if e.get("cat") in ("cuda_runtime", "cuda_driver"):
                rt[e["name"]].append(e["dur"])
        res = dict(timing)
        if kern:
            k0, k1 = kern[0][0], max(k[1] for k in kern)
            enc0, enc1 = ann.get("encode", (k0, k0))
            sync1 = ann.get("sync", (k1, k1))[1]
            busy = union([(s, e) for s, e, _ in kern])
            gaps = sorted(max(0.0, kern[i + 1][0] - max(k[1] for k in kern[: i + 1])) for i in range(len(kern) - 1))
            by_name = collections.defaultdict(list)
            for s, e, n in kern:
                by_name[n[:60]].append(e - s)
            res.update(kernels=len(kern), kernels_per_call=len(kern) / N, busy_us_per_call=busy / N,
                       span_us_per_call=(k1 - k0) / N, first_kernel_after_encode_start_us=k0 - enc0,
                       encode_span_us=enc1 - enc0, last_kernel_end_to_sync_end_us=sync1 - k1,
                       idle_us_per_call=(k1 - k0 - busy) / N,
                       gap_p50_us=gaps[len(gaps) // 2] if gaps else 0, gap_p90_us=gaps[int(len(gaps) * 0.9)] if gaps else 0,
                       gaps_over_5us=sum(g > 5 for g in gaps),
                       kernel_median_us={n: round(statistics.median(d), 2) for n, d in by_name.items()},
                       kernel_count={n: len(d) for n, d in by_name.items()})
        res["runtime"] = {n: {"count": len(d), "sum_us": round(sum(d), 1), "median_us": round(statistics.median(d), 2)}
                          for n, d in rt.items()}
        summary[f"{name}_{rep}"] = res
        print(name, rep, json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in res.items()
                                     if not isinstance(v, dict)}), flush=True)
        if rep == 1 and name in ("cascade", "sdpa"):
            with open(path, "rb") as f, gzip.open(f"{out}/trace_{name}.json.gz", "wb") as g:
                g.write(f.read())
json.dump(summary, open(f"{out}/kineto_summary.json", "w"), indent=1)
