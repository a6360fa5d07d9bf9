"""What creating a small device array from host data costs the H200 machine's host (mx.array from NumPy: the
CUDA allocator's managed buffers), with the GPU idle and while it runs a long queue of matmuls, the arrays
kept alive for two iterations as an engine's in-flight steps keep theirs."""
import json, statistics, time
from collections import deque
import mlx.core as mx
import numpy as np

def creations(n, loops=400, busy=False):
    host = np.arange(n, dtype=np.int32)
    alive = deque(maxlen=2 * 8)
    w = mx.random.normal((8192, 8192), dtype=mx.bfloat16); x = mx.random.normal((64, 8192), dtype=mx.bfloat16)
    mx.eval(w, x)
    times = []
    for i in range(loops):
        if busy and i % 8 == 0:
            y = x
            for _ in range(40):
                y = (y @ w) * 1e-3
            mx.async_eval(y)
        t = time.perf_counter()
        a = mx.array(host)
        times.append(time.perf_counter() - t)
        alive.append(a)
        if busy and i % 8 == 7:
            mx.async_eval(mx.sum(mx.stack([b[:1] for b in alive])))
    mx.synchronize()
    return {"n": n, "busy": busy, "median_us": round(1e6 * statistics.median(times), 2),
            "p90_us": round(1e6 * sorted(times)[int(0.9 * len(times))], 2), "max_us": round(1e6 * max(times), 1)}

out = [creations(n, busy=b) for b in (False, True) for n in (32, 33, 8256, 8288)]
for row in out:
    print(json.dumps(row), flush=True)
t = time.perf_counter()
for _ in range(1000):
    mx.zeros((32,), mx.int32)
print(json.dumps({"lazy_zeros_us": round(1e3 * (time.perf_counter() - t), 2)}))
