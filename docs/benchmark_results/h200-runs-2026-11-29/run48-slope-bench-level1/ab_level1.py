"""A/B of level 1's launch shape (it runs beside level 0 and, by CUPTI, stretches it from ~32 to ~37-39 us at
8192 x 32): base (4 warps, 64-token chunks, one tile a row), 2 warps with 32-token chunks (half the shared
memory), 2 warps with 64-token chunks, 4 warps with two tiles a row. Outputs compared to base first; arms
interleaved (measure_all, slope timing). Usage: ab_level1.py S1xB1,S2xB2 REPS"""
import dataclasses, json, sys
import mlx.core as mx
import gpu_attention_bench as b
from mlxcel.kernels import backend, cuda, fused
from mlxcel.kernels.tile_plan import fused_tiles, head_layout

K = backend().KERNELS
K.cascade_break_even_bytes = 0
K32 = fused.FusedKernels(dataclasses.replace(K.platform, chunk_tokens=32))
cells = [tuple(int(x) for x in c.split("x")) for c in sys.argv[1].split(",")]
reps = int(sys.argv[2])
report = {}
for S, B in cells:
    cell = b.Cell(S, 256, B)
    plan, layout, private = cell.cascade_views
    members = tuple(plan.members)
    q0, kp0 = cell.queries[0], cell.k_pools[0]

    def step_with(warps, pages, kern):
        original = K.cascade_levels

        def levels(*args, **kw):
            (stacked, plan0), _ = original(*args, **kw)
            flat = head_layout(32 // 8, warps)
            return (stacked, plan0), (flat, fused_tiles(private, pages, flat, 8))
        K.cascade_levels = levels
        try:
            step = K._cascade_step(q0, kp0, layout.shared, private, members, cell.scale, None, None, None)
        finally:
            K.cascade_levels = original
        flat = head_layout(4, warps)
        plan1 = fused_tiles(private, pages, flat, 8)
        if kern is not K:
            step = dataclasses.replace(step, level1=kern.partial_launch(q0, kp0, plan1.num_tiles, flat, cell.scale, False))
        return step

    def arm(step):
        def call(i, dep=None):
            s = i % cell.sets
            q = cell.query(i, dep)
            o0, lse0 = K._run_partial(step.level0, q, cell.k_pools[s], cell.v_pools[s], layout.shared, step.geometry0,
                                      step.member_list)
            o1, lse1 = K._run_partial(step.level1, q, cell.k_pools[s], cell.v_pools[s], private, step.geometry1)
            return step.merge([o1, lse1, step.indptr1, o0, lse0, step.member_of_row], None)[0]
        return call

    arms = {"base": arm(step_with(4, None, K)), "w2c32": arm(step_with(2, None, K32)),
            "w2c64": arm(step_with(2, None, K)), "w4x2tiles": arm(step_with(4, 4, K))}
    ref = arms["base"](0)
    engine = cell.cascade(0)
    errs = {n: b.relative_error(a(0), ref) for n, a in arms.items()}
    errs["base_vs_engine"] = b.relative_error(ref, engine)
    print(S, B, "errors", errs, flush=True)
    res = b.measure_all(arms, reps)
    report[f"{S}x{B}"] = {"errors": errs, **{n: {k: v * 1e6 for k, v in r.items()} for n, r in res.items()}}
    print(S, B, " ".join(f"{n}={r['s'] * 1e6:.1f}({r['iqr_s'] * 1e6:.1f})" for n, r in res.items()), flush=True)
print(json.dumps(report))
