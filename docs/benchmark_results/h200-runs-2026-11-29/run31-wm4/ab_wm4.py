"""A/B: level 0 with four head-splitting warps (64-head groups: half the L2 traffic) held to three blocks per
SM by launch bounds, vs the default two (32-head groups), vs four without bounds (170 registers, two per SM).
Arms rotate order every round after a throwaway warm-up arm."""
import dataclasses, json, statistics
import mlx.core as mx
from mlxcel.kernels import cuda, fused
import gpu_attention_bench as b

p = cuda.KERNELS.platform
BOUNDS = "\n#undef __global__\n#define __global__ __attribute__((global)) __launch_bounds__(128, 3)\n"
bounded = fused.FusedKernels(dataclasses.replace(p, header=p.header + BOUNDS))
for shared, batch in [(8192, 32), (32768, 32), (8192, 64), (2048, 64)]:
    cell = b.Cell(shared, 256, batch)
    plan, layout, private = cell.cascade_views
    def arm(k, wm):
        def call(i, dep=None):
            s = i % cell.sets
            return k.cascade_decode(cell.query(i, dep), cell.k_pools[s], cell.v_pools[s], layout.shared, private,
                                    plan.members, scale=cell.scale, level0_warps_m=wm)
        return call
    arms = {"wm2": arm(cuda.KERNELS, None), "wm4": arm(cuda.KERNELS, 4), "wm4_bounded": arm(bounded, 4)}
    flat = cell.flat(0)
    errors = {k: round(b.relative_error(a(0), flat), 5) for k, a in arms.items()}
    b.measure(cell.flat, 5)
    names = list(arms)
    times = {k: [] for k in arms}
    for r in range(6):
        for k in names[r % 3:] + names[:r % 3]:
            times[k].append(round(b.measure(arms[k], 7)["s"] * 1e6, 1))
    print(json.dumps({"cell": f"{shared}x{batch}", "vs_flat": errors, **times,
                      **{f"{k}_median": statistics.median(v) for k, v in times.items()}}), flush=True)
