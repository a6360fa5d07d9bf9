"""A/B: page lookups kept as raw ints until stage() (new, working tree) vs multiplied right after the load (old, HEAD).
Level 0 alone, the cascade step and the flat launch; interleaved, rotated order (b.measure_all); two rounds."""
import dataclasses, json, sys
import mlx.core as mx
from mlxcel.kernels import cuda, fused
from mlxcel.kernels.tile_plan import fused_tiles, head_layout
import gpu_attention_bench as b

p = cuda.KERNELS.platform
kernels = {"new": cuda.KERNELS,
           "old": fused.FusedKernels(dataclasses.replace(p, partial_source=open("ab_step/old_partial.txt").read()))}
out = []
for rnd in range(2):
    for shared, batch in [(8192, 32), (32768, 32), (2048, 32), (8192, 4), (32768, 4), (2048, 64)]:
        cell = b.Cell(shared, 256, batch)
        plan, layout, private = cell.cascade_views
        level0, _ = cuda.KERNELS.cascade_levels(b.HQ, b.HKV, len(plan.members), layout.shared, private)
        flat_layout = head_layout(b.HQ // b.HKV, p.warps)
        flat_plan = fused_tiles(cell.csr, None, flat_layout, b.HKV)
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
        checks = {"level0_new_vs_old": float(mx.abs(calls["level0_new"](0) - calls["level0_old"](0)).max()),
                  "cascade_new_vs_old": float(mx.abs(calls["cascade_new"](0).astype(mx.float32) - calls["cascade_old"](0).astype(mx.float32)).max()),
                  "flat_new_vs_old": float(mx.abs(calls["flat_new"](0) - calls["flat_old"](0)).max()),
                  "cascade_new_vs_flat": b.relative_error(calls["cascade_new"](0), calls["flat_new"](0))}
        stats = b.measure_all(calls, 10)
        r = {"round": rnd, "cell": f"{shared}x{batch}", "checks": checks,
             **{n: round(s["s"] * 1e6, 1) for n, s in stats.items()}}
        out.append(r)
        print(json.dumps(r), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
