"""A/B timing, HEAD's kernels (ab_step/cuda_head.py) vs the working tree's: the cascade step and the flat
launch, interleaved in rotated order, outputs compared first; two rounds."""
import json, sys
import gpu_attention_bench as b
from ab_merge_kernels import kernels

out = []
for rnd in range(2):
    for shared, batch in [(8192, 32), (32768, 32), (2048, 64), (8192, 4), (8192, 64)]:
        cell = b.Cell(shared, 256, batch)
        plan, layout, private = cell.cascade_views
        calls = {}
        for name, k in kernels.items():
            def casc(i, dep=None, k=k):
                s = i % cell.sets
                return k.cascade_decode(cell.query(i, dep), cell.k_pools[s], cell.v_pools[s], layout.shared, private,
                                        plan.members, scale=cell.scale)
            calls[f"cascade_{name}"] = casc
        calls["chain"] = cell.chain_only
        checks = {"cascade": b.relative_error(calls["cascade_new"](0), calls["cascade_old"](0))}
        stats = b.measure_all(calls, 10)
        r = {"round": rnd, "cell": f"{shared}x{batch}", "checks": checks,
             **{n: round(s["s"] * 1e6, 1) for n, s in stats.items()},
             **{f"{n}_encode": round(s["encode_s"] * 1e6, 1) for n, s in stats.items()}}
        out.append(r)
        print(json.dumps(r), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
