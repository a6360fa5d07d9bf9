"""The cascade step's four skinny launches at 32 rows (q/k/v with its norm, o with its residual, gate/up with
its norm and swiglu, down with its residual), each twice over weights past the L2, for ncu."""
import mlx.core as mx

from mlxcel.kernels.cuda_matmul import skinny_matmul

K, H, MLP = 4096, 4096, 12288
x = mx.random.normal((32, 1, K)).astype(mx.bfloat16)
g = mx.ones((K,), mx.bfloat16)
weights = {"qkv": mx.random.normal((6144, K)), "o": mx.random.normal((H, K)),
           "gate_up": mx.random.normal((2 * MLP, K)), "down": mx.random.normal((H, MLP))}
weights = {k: (w * 0.01).astype(mx.bfloat16) for k, w in weights.items()}
h = mx.random.normal((32, 1, MLP)).astype(mx.bfloat16)
mx.eval(x, g, h, *weights.values())
for _ in range(2):
    mx.eval(skinny_matmul(x, weights["qkv"], norm=(g, 1e-6)))
    mx.eval(skinny_matmul(x, weights["o"], residual=x))
    mx.eval(skinny_matmul(x, weights["gate_up"], norm=(g, 1e-6), swiglu=True))
    mx.eval(skinny_matmul(h, weights["down"], residual=x))
