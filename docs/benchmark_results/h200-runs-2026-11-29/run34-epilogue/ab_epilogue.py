"""A/B at the kernel level: old = HEAD~ partial source (scalar epilogue), uncompacted sources; epi = the
vectorized epilogue, uncompacted; new = vectorized epilogue, compacted sources (what main ships).
Level 0 alone, the cascade step, the flat launch; interleaved rotated order (b.measure_all); two rounds."""
import dataclasses, json, sys
import mlx.core as mx
from mlxcel.kernels import cuda, fused
import gpu_attention_bench as b

p = cuda.KERNELS.platform
D = 128


def make(partial_source, compact):
    k = fused.FusedKernels(dataclasses.replace(p, partial_source=partial_source))
    saved = fused.compact_source
    if not compact:
        fused.compact_source = lambda text: text
    for kind, warps in (("partial", p.warps), ("merge", 0), ("cascade_merge", 0)):
        k._kernel(kind, D, warps)
    fused.compact_source = saved
    return k


kernels = {"old": make(open("ab_step/old_partial.txt").read(), False),
           "epi": make(p.partial_source, False), "new": make(p.partial_source, True)}
out = []
for rnd in range(2):
    for shared, batch in [(8192, 32), (32768, 32), (2048, 32), (8192, 4), (32768, 4), (2048, 64), (8192, 64)]:
        cell = b.Cell(shared, 256, batch)
        plan, layout, private = cell.cascade_views
        level0, _ = cuda.KERNELS.cascade_levels(b.HQ, b.HKV, len(plan.members), layout.shared, private)
        calls = {}
        for name, k in kernels.items():
            def l0(i, dep=None, k=k):
                s = i % cell.sets
                return k.partial_tiles(cell.query(i, dep), cell.k_pools[s], cell.v_pools[s], layout.shared,
                                       level0[1].geometry, level0[0], cell.scale, layout.members)[0]
            def casc(i, dep=None, k=k):
                s = i % cell.sets
                return k.cascade_decode(cell.query(i, dep), cell.k_pools[s], cell.v_pools[s], layout.shared, private,
                                        plan.members, scale=cell.scale)
            def flat(i, dep=None, k=k):
                s = i % cell.sets
                return k.paged_attention_partial(cell.query(i, dep), cell.k_pools[s], cell.v_pools[s], cell.csr,
                                                 scale=cell.scale)[0]
            calls.update({f"level0_{name}": l0, f"cascade_{name}": casc, f"flat_{name}": flat})
        ref = calls["flat_old"](0)
        checks = {n: b.relative_error(c(0), ref if n.startswith("flat") else calls["cascade_old"](0))
                  for n, c in calls.items() if not n.startswith("level0")}
        checks["level0_new_vs_old"] = b.relative_error(calls["level0_new"](0), calls["level0_old"](0))
        stats = b.measure_all(calls, 10)
        r = {"round": rnd, "cell": f"{shared}x{batch}", "checks": checks,
             **{n: [round(s["s"] * 1e6, 1), round(s["encode_s"] * 1e6, 1), round(s["host_s"] * 1e6, 1)]
                for n, s in stats.items()}}
        out.append(r)
        print(json.dumps(r), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
