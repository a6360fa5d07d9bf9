"""A/B: level 0 in 32-token chunks x 4 stages (new) vs 64 x 2 (old), same smem; ABBA after a throwaway arm."""
import dataclasses, json, statistics
import mlx.core as mx
from mlxcel.kernels import cuda, fused
import gpu_attention_bench as b

new = cuda.KERNELS
old = fused.FusedKernels(dataclasses.replace(cuda.KERNELS.platform, min_chunk_tokens=64))
for shared, batch in [(8192, 32), (32768, 32), (8192, 64), (2048, 32), (2048, 64), (8192, 4), (32768, 4)]:
    cell = b.Cell(shared, 256, batch)
    plan, layout, private = cell.cascade_views
    def arm(k):
        def call(i, dep=None):
            s = i % cell.sets
            return k.cascade_decode(cell.query(i, dep), cell.k_pools[s], cell.v_pools[s], layout.shared, private,
                                    plan.members, scale=cell.scale)
        return call
    arms = {"old_64x2": arm(old), "new_32x4": arm(new)}
    flat = cell.flat(0)
    errors = {k: b.relative_error(a(0), flat) for k, a in arms.items()}
    b.measure(cell.flat, 5)
    times = {k: [] for k in arms}
    for r in range(6):
        for k in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            times[k].append(round(b.measure(arms[k], 7)["s"] * 1e6, 1))
    print(json.dumps({"cell": f"{shared}x{batch}", "vs_flat": errors, **times,
                      **{f"{k}_median": statistics.median(v) for k, v in times.items()}}), flush=True)
