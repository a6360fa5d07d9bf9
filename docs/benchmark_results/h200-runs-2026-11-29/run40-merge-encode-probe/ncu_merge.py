"""ncu target: the cascade step and the flat launch at 8192 x 32, HEAD's sources then the working tree's, 3 each."""
import mlx.core as mx
import ab_merge_kernels as k
import gpu_attention_bench as b

cell = b.Cell(8192, 256, 32)
plan, layout, private = cell.cascade_views
for name, kern in k.kernels.items():
    for i in range(3):
        mx.eval(kern.cascade_decode(cell.queries[0], cell.k_pools[0], cell.v_pools[0], layout.shared, private,
                                    plan.members, scale=cell.scale))
        mx.eval(kern.paged_attention_partial(cell.queries[0], cell.k_pools[0], cell.v_pools[0], cell.csr,
                                             scale=cell.scale)[0])
    mx.synchronize()
