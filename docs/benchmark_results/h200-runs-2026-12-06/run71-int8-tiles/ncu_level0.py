"""Level 0 of the fused cascade step at 32768 shared x 32, bf16 then int8 pages, two steps each, for ncu
(-k regex:warpgroup): where the int8 level's time goes against bf16's."""
from dataclasses import replace

import mlx.core as mx

from gpu_attention_bench import Cell
from mlxcel.kernels import backend
from mlxcel.kernels.kv_quant import FORMATS, QuantizedPages, quantize

cell = Cell(32768, 256, 32)
_, layout, private = cell.cascade_views
k, v = cell.k_pools[0], cell.v_pools[0]
kq, vq = QuantizedPages(*quantize(k, FORMATS["int8"])), QuantizedPages(*quantize(v, FORMATS["int8"]))
mx.eval(kq, vq)
for pools in ((k, v), (kq, vq)):
    shape = replace(cell.shape, pool_dtype=pools[0].dtype)
    step = backend().KERNELS.prepare_cascade(shape, cell.batch, private, layout.kernel_levels)
    for _ in range(2):
        mx.eval(step(cell.query(0, None), *pools, private.last_page_len))
