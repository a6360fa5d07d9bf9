"""One decode layer's eval time, cascade off, 8 rows: the whole trace, the traced halves with the attention and
the store between, and variants, each called on one step's captured inputs many times (interleaved)."""
import time, sys
from functools import partial
import mlx.core as mx, numpy as np
from mlxcel.engine import layer_halves, model as model_mod
from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.model import load_model
from mlxcel.engine.sequence import SamplingParams
from mlxcel.kernels.kv_quant import store
loaded = load_model("/root/.cache/mlxcel/models/tiny-qwen3-v2")
rng = np.random.default_rng(0)
prefix = rng.integers(3, 1000, 1024).tolist()
prompts = [prefix + rng.integers(3, 1000, 16).tolist() for _ in range(8)]
e = Engine(loaded, EngineConfig(num_blocks=2048), cascade=CascadeConfig(False, 16, 2))
seqs = [e.submit(p, SamplingParams(max_tokens=400, ignore_eos=True)) for p in prompts]
while not all(s.num_completion_tokens > 8 for s in seqs): e.step()
captured = {}
real = layer_halves.LayerHalves.traced_whole
def spy(self, ops, attention, in_kernel):
    fn = real(self, ops, attention, in_kernel)
    def call(*args):
        if "args" not in captured:
            captured.update(layer=self, ops=ops, attention=attention, in_kernel=in_kernel, args=args)
        return fn(*args)
    return call
layer_halves.LayerHalves.traced_whole = spy
e.step(); e.step()
layer_halves.LayerHalves.traced_whole = real
c = captured
L, ops, att = c["layer"], c["ops"], c["attention"]
residual, h, positions, blocks, offsets, kp, vp, lpl, arrays, rope = c["args"]
mx.eval(c["args"])
del captured["args"]
pools = {name: [mx.array(kp) + 0, mx.array(vp) + 0] for name in ("whole", "halves", "halves+traced att", "plain whole")}
mx.eval(pools)
e.stop(); del e, kp, vp
whole_traced = L.traced_whole(ops, att, c["in_kernel"])
before_t, after_t = L.traced(ops)
launch = att.rebind(arrays)
def run_whole():
    p = pools["whole"]
    out = whole_traced(residual, h, positions, blocks, offsets, p[0], p[1], lpl, arrays, rope)
    p[:] = out[2:4]
    mx.eval(out)
def run_plain_whole():
    p = pools["plain whole"]
    out = layer_halves.whole(L.layer, ops, att, False, residual, h, positions, blocks, offsets, p[0], p[1], lpl, arrays, rope)
    p[:] = out[2:4]
    mx.eval(out)
def run_halves():
    r, q, k, v = before_t(residual, h, positions, blocks, offsets, None, None, rope)
    k2, v2 = pools["halves"]
    k2[blocks, offsets] = k.astype(k2.dtype); v2[blocks, offsets] = v.astype(v2.dtype)
    out = after_t(r, launch(q, k2, v2, lpl))
    mx.eval(out, k2, v2)
att_only = mx.compile(lambda q, k, v, l, arrays: att.rebind(arrays)(q, k, v, l))
def run_halves_traced_attention():
    r, q, k, v = before_t(residual, h, positions, blocks, offsets, None, None, rope)
    k2, v2 = pools["halves+traced att"]
    k2[blocks, offsets] = k.astype(k2.dtype); v2[blocks, offsets] = v.astype(v2.dtype)
    out = after_t(r, att_only(q, k2, v2, lpl, arrays))
    mx.eval(out, k2, v2)
arms = {"whole": run_whole, "halves": run_halves, "halves+traced att": run_halves_traced_attention,
        "plain whole": run_plain_whole}
times = {k: [] for k in arms}
for f in arms.values(): f(); f()
for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 30):
    for k, f in arms.items():
        t = time.perf_counter()
        for _ in range(5): f()
        times[k].append((time.perf_counter() - t) / 5)
for k, v in times.items():
    print(f"{k:20s} median {1e3*np.median(v):.3f} ms  min {1e3*min(v):.3f}")
