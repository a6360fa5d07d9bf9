"""nsys target: 100 chained cascade steps at 8192 x 32 (as the bench times them), then 100 chained SDPA calls."""
import mlx.core as mx
import gpu_attention_bench as b

cell = b.Cell(8192, 256, 32)
sdpa = cell.sdpa_call()
for call in (cell.cascade, sdpa):
    for i in range(3):
        mx.eval(call(i))
    mx.synchronize()
for name, call in (("cascade", cell.cascade), ("sdpa", sdpa)):
    device, host, encode = b.chained_rep(call, 100)
    print(name, "device us", round(device * 1e6, 1), "encode us", round(encode * 1e6, 1), flush=True)
