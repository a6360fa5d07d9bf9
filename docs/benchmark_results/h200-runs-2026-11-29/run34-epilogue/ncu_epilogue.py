"""ncu target: the cascade step and the flat launch at 8192 x 32 with the old and the new partial source, 3 each."""
import dataclasses
import mlx.core as mx
from mlxcel.kernels import cuda, fused
import gpu_attention_bench as b

p = cuda.KERNELS.platform
arms = {"old": fused.FusedKernels(dataclasses.replace(p, partial_source=open("ab_step/old_partial.txt").read())),
        "new": cuda.KERNELS}
cell = b.Cell(8192, 256, 32)
plan, layout, private = cell.cascade_views
for name, k in arms.items():
    for i in range(3):
        mx.eval(k.cascade_decode(cell.queries[0], cell.k_pools[0], cell.v_pools[0], layout.shared, private,
                                 plan.members, scale=cell.scale))
        mx.eval(k.paged_attention_partial(cell.queries[0], cell.k_pools[0], cell.v_pools[0], cell.csr,
                                          scale=cell.scale)[0])
    mx.synchronize()
    print("arm", name, flush=True)
