"""Does mx.compile take the CUDA layer-op kernels (and the in-place pool store) on MLX's CUDA backend, with the
same results as the plain calls, and what does a traced layer segment cost the host against the plain one?"""
import time
import mlx.core as mx
import mlx.nn as nn
from mlxcel.kernels.cuda_layer_ops import CUDA_OPS
from mlxcel.kernels.layer_ops import HeadSplit, PoolSlots

rows, hid, hq, hkv, d, blocks, bs = 32, 4096, 32, 8, 128, 64, 32
mx.random.seed(0)
W = (mx.random.normal(((hq + 2 * hkv) * d, hid)) * 0.02).astype(mx.bfloat16)
nw = mx.random.uniform(0.5, 1.5, (hid,)).astype(mx.bfloat16)
qn, kn = nn.RMSNorm(d), nn.RMSNorm(d)
heads = HeadSplit(hq, hkv, d, nn.RoPE(d, base=1e6), qn, kn)
res = mx.random.normal((rows, 1, hid)).astype(mx.bfloat16)
delta = mx.random.normal((rows, 1, hid)).astype(mx.bfloat16)
pos = mx.arange(100, 100 + rows, dtype=mx.int32)
sb = mx.arange(rows, dtype=mx.int32) % blocks
so = mx.arange(rows, dtype=mx.int32) % bs

def segment(res, delta, kp, vp, pos, sb, so):
    r, x = CUDA_OPS.add_rms_norm(res, delta, nw, 1e-6)
    q, _, _ = CUDA_OPS.split_heads(heads, x @ W.T, pos, PoolSlots(kp, vp, sb, so))
    return r, q

def pools():
    kp = mx.zeros((blocks, bs, hkv, d), mx.bfloat16); vp = mx.zeros((blocks, bs, hkv, d), mx.bfloat16)
    mx.eval(kp, vp); return kp, vp

kp1, vp1 = pools(); r1, q1 = segment(res, delta, kp1, vp1, pos, sb, so); mx.eval(r1, q1, kp1, vp1)
compiled = mx.compile(segment)
kp2, vp2 = pools(); r2, q2 = compiled(res, delta, kp2, vp2, pos, sb, so); mx.eval(r2, q2, kp2, vp2)
print("compiled == plain:", all(mx.array_equal(a, b).item() for a, b in [(r1, r2), (q1, q2), (kp1, kp2), (vp1, vp2)]),
      "pool written:", bool((mx.abs(kp2).sum() > 0).item()))
for name, f in [("plain", segment), ("compiled", compiled)] * 2:
    mx.synchronize(); t = time.perf_counter()
    for _ in range(500):
        out = f(res, delta, kp1, vp1, pos, sb, so)
    built = time.perf_counter() - t
    mx.eval(out); mx.synchronize()
    print(f"{name}: build {built / 500 * 1e6:.1f} us a call")
for name, f in [("plain", segment), ("compiled", compiled)] * 2:
    mx.synchronize(); t = time.perf_counter()
    for _ in range(200):
        out = f(res, delta, kp1, vp1, pos, sb, so); mx.async_eval(out)
    mx.synchronize()
    print(f"{name}: build + async_eval {(time.perf_counter() - t) / 200 * 1e6:.1f} us a call")
