"""Two fused cascade steps at 8192 shared x 32 (tail 96) as gpu_attention_bench.py launches them, for ncu."""
import mlx.core as mx

from gpu_attention_bench import Cell, every_span_kept

with every_span_kept():
    call = Cell(8192, 96, 32).fused_cascade(None)
mx.eval(call(0))
mx.eval(call(1))
