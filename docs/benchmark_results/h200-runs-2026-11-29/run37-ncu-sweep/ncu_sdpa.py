"""ncu target: at the batch-32 cells, MLX SDPA over contiguous K/V, the fused cascade step and the flat launch, 3 each."""
import sys
import mlx.core as mx
import gpu_attention_bench as b

for shared in (8192, 32768, 2048):
    cell = b.Cell(shared, 256, 32)
    sdpa = cell.sdpa_call()
    mx.synchronize()
    for i in range(3):
        mx.eval(sdpa(0))
        mx.eval(cell.cascade(0))
        mx.eval(cell.flat(0))
    mx.synchronize()
