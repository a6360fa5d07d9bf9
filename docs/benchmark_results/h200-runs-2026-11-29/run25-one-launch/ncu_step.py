"""ncu target: the one-launch cascade step (and a no-fold variant) and the three-launch step, a few calls each."""
import dataclasses, sys
import mlx.core as mx
from mlxcel.kernels import cuda, fused
import gpu_attention_bench as b

p = cuda.KERNELS.platform
S = p.cascade_step_source
H = p.header
RELAXED = H.replace('asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");\n    if (seen >= target) return;',
                    'asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");\n    if (seen >= target) { asm volatile("fence.acq_rel.gpu;" ::: "memory"); return; }')
assert RELAXED != H
variants = {
    "dyn_relaxed": fused.FusedKernels(dataclasses.replace(p, header=RELAXED)),
    "dyn_nowait": fused.FusedKernels(dataclasses.replace(p, header=H.replace("if (seen >= target) return;", "return;"))),
}
for shared, batch in [(32768, 32), (8192, 32)]:
    cell = b.Cell(shared, 256, batch)
    plan, layout, private = cell.cascade_views
    for name, k in variants.items():
        for i in range(4):
            mx.eval(k.cascade_decode(cell.queries[0], cell.k_pools[0], cell.v_pools[0], layout.shared, private,
                                     plan.members, scale=cell.scale))
        mx.synchronize()
