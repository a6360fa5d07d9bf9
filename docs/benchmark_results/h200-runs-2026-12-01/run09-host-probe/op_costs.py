"""The host's cost of one op on MLX's CUDA backend, by kind: building it (Python) and encoding it
(mx.async_eval), each op on evaluated inputs, 400 of a kind per graph; graph settings from the environment."""
import json, os, sys, time
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu
from mlxcel.kernels.cuda_layer_ops import CUDA_OPS

mx.random.seed(0)
x = mx.random.normal((32, 1, 4096)).astype(mx.bfloat16)
w = (mx.random.normal((6144, 4096)) * 0.02).astype(mx.bfloat16)
wt = w.T
gu = mx.random.normal((32, 1, 24576)).astype(mx.bfloat16)
nw = mx.ones((4096,), mx.bfloat16)
mx.eval(x, w, wt, gu, nw)
kinds = {
    "matmul (evaluated transposed view)": lambda: x @ wt,
    "matmul + transpose": lambda: x @ w.T,
    "add_rms_norm kernel": lambda: CUDA_OPS.add_rms_norm(x, x, nw, 1e-6)[1],
    "reshape": lambda: x.reshape(32, 4096),
    "slice (split half)": lambda: gu[..., :12288],
    "swiglu (compiled, on slices)": lambda: swiglu(gu[..., :12288], gu[..., 12288:]),
    "add": lambda: x + x,
}
out = {"env": {k: v for k, v in os.environ.items() if k.startswith("MLX_")}}
for name, op in list(kinds.items()) * 2:
    mx.synchronize()
    t0 = time.perf_counter()
    outs = [op() for _ in range(400)]
    t1 = time.perf_counter()
    mx.async_eval(outs)
    t2 = time.perf_counter()
    mx.synchronize()
    out[name] = {"build_us": round((t1 - t0) / 400 * 1e6, 2), "encode_us": round((t2 - t1) / 400 * 1e6, 2)}
print(json.dumps(out, indent=1))
