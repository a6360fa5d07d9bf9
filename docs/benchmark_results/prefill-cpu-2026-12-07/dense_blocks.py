"""One layer's causal dense attention on the CPU (portable.dense_attention, SmolLM2's 9 query and 3 KV heads of
64), a chunk of L query tokens after T - L cached: unblocked against 2, 4 and 8 query blocks, each over the keys
up to its last token; the same inputs a shape, outputs checked against the unblocked one (float32 rounding:
the blocks' matmuls may sum in another order); best of 5.

    python dense_blocks.py
"""

import time

import mlx.core as mx

from mlxcel.kernels import portable


def attend(q, k, v, mask, blocks):
    length, tokens = q.shape[2], k.shape[2]
    step = length // blocks
    outs = []
    for start in range(0, length, step):
        seen = tokens - length + start + step
        outs.append(portable.dense_attention(q[:, :, start:start + step], k[:, :, :seen], v[:, :, :seen],
                                             mask[:, :, start:start + step, :seen], scale=0.125))
    return mx.concatenate(outs, axis=2)


def best(fn) -> float:
    times = []
    for _ in range(5):
        start = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    mx.random.seed(0)
    for length, tokens in ((512, 512), (512, 1024)):
        q = mx.random.normal((1, 9, length, 64))
        k, v = mx.random.normal((1, 3, tokens, 64)), mx.random.normal((1, 3, tokens, 64))
        mask = (mx.arange(tokens)[None, :] <= (tokens - length + mx.arange(length))[:, None])[None, None]
        mx.eval(q, k, v, mask)
        whole = portable.dense_attention(q, k, v, mask, scale=0.125)
        unblocked = best(lambda: portable.dense_attention(q, k, v, mask, scale=0.125))
        line = f"L={length} T={tokens}: unblocked {unblocked:.1f} ms"
        for blocks in (2, 4, 8):
            diff = float(mx.abs(attend(q, k, v, mask, blocks) - whole).max())
            assert diff < 1e-5, diff
            line += f" | {blocks} blocks {best(lambda: attend(q, k, v, mask, blocks)):.1f} ms"
        print(line, flush=True)


if __name__ == "__main__":
    main()
