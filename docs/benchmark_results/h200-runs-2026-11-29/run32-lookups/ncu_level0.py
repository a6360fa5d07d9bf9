"""ncu target: cascade level 0 alone at 8192 x 32, a few launches."""
import mlx.core as mx
from mlxcel.kernels import cuda
import gpu_attention_bench as b

cell = b.Cell(8192, 256, 32)
plan, layout, private = cell.cascade_views
level0, _ = cuda.KERNELS.cascade_levels(b.HQ, b.HKV, len(plan.members), layout.shared, private)
for i in range(6):
    mx.eval(cuda.KERNELS.partial_tiles(cell.queries[0], cell.k_pools[0], cell.v_pools[0], layout.shared,
                                       level0[1].geometry, level0[0], cell.scale, layout.members)[0])
mx.synchronize()
