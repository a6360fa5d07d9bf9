"""A/B of the timing chain: the bench's three chain kernels (multiply, cast, add) against the same dependency
compiled into one kernel (mx.compile), for SDPA, cascade and the chain alone, at one cell; arms interleaved
(gpu_attention_bench.measure_all). Outputs of both chain forms are compared first. Usage: ab_chain.py S B REPS"""
import json, sys
import mlx.core as mx
import gpu_attention_bench as b
from mlxcel.engine.attention import paged_decode_attention

S, B, REPS = (int(x) for x in sys.argv[1:4])
cell = b.Cell(S, 256, B)
kv = [(cell.contiguous(k), cell.contiguous(v)) for k, v in zip(cell.k_pools, cell.v_pools)]
mx.eval(kv)
fused = mx.compile(lambda q, o: q + (o.reshape(-1)[:1] * 0).astype(q.dtype))


def sdpa_q(i, q):
    k, v = kv[i % cell.sets]
    return mx.fast.scaled_dot_product_attention(q[:, :, None, :], k, v, scale=cell.scale)[:, :, 0]


def cascade_q(i, q):
    s = i % cell.sets
    return paged_decode_attention(q, cell.k_pools[s], cell.v_pools[s], cell.csr, scale=cell.scale, config=b.ON)


def three(fn):  # dep arrives as out.reshape(-1)[:1] * 0 (b.chain); query() casts and adds
    return lambda i, dep=None: fn(i, cell.query(i, dep))


def one(fn):  # dep arrives as the raw previous output; one compiled kernel makes q
    def call(i, dep=None):
        q = cell.queries[i % cell.sets]
        return fn(i, q if dep is None else fused(q, dep))
    call.raw = True
    return call


def chain(call, n):
    out = None
    for i in range(n):
        raw = getattr(call, "raw", False)
        out = call(i, None if out is None else (out if raw else out.reshape(-1)[:1] * 0))
    return out


b.chain = chain
ident = lambda i, q: q
arms = {"chain3": three(ident), "chain1": one(ident), "sdpa3": three(sdpa_q), "sdpa1": one(sdpa_q),
        "cascade3": three(cascade_q), "cascade1": one(cascade_q)}
for base in ("sdpa", "cascade"):
    a, c = chain(arms[base + "3"], 4), chain(arms[base + "1"], 4)
    print(base, "chain forms differ by", b.relative_error(c, a), flush=True)
res = b.measure_all(arms, REPS)
for name, r in res.items():
    print(name, " ".join(f"{k}={v * 1e6:.1f}us" for k, v in r.items()), flush=True)
for form in ("3", "1"):
    print(f"chain{form}: SDPA/cascade {res['sdpa' + form]['s'] / res['cascade' + form]['s']:.2f}x", flush=True)
print(json.dumps({k: {kk: vv * 1e6 for kk, vv in v.items()} for k, v in res.items()}))
