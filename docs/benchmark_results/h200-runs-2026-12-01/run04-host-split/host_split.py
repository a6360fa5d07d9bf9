"""Where a decode step's host time goes on the H200 machine: building the graph (Python) against MLX's encoding
of it (mx.async_eval with the GPU idle), at the end-to-end cell, cascade on and off; and the same with each
layer's MLP (norm, gate_up, swiglu, down, residual) traced once by mx.compile."""
import json, sys, time
import mlx.core as mx
import numpy as np
import gpu_e2e_bench as e2e
from mlxcel.engine.model import StepContext, output_logits

stock, loaded = e2e.random_models(e2e.Path("/tmp/qwen3-8b-random"), 36)
del stock
batch = e2e.prompts(32, 8192, 32)
out = {}

def measure(engine, label):
    r = engine.runner
    seqs = list(engine.scheduler.running)
    last = mx.array([s.token_ids[-1] for s in seqs], dtype=mx.int32)
    builds, encodes, totals = [], [], []
    for _ in range(12):
        mx.synchronize()
        t0 = time.perf_counter()
        positions = np.fromiter((s.num_cached_tokens - 1 for s in seqs), np.int32, len(seqs))
        csr = r.csr_builder.build(("probe",) + tuple((s.id, s.table_version) for s in seqs),
                                  [s.block_table for s in seqs], positions + 1)
        plan = r.planner.plan(csr, engine.cascade.snapshot(), r.shape)
        bs = r.pool.block_size
        blocks = [s.block_table[p // bs] for s, p in zip(seqs, positions.tolist())]
        ctx = StepContext(r.pool, mx.array(positions), mx.array(blocks, dtype=mx.int32), mx.array(positions % bs),
                          decode_rows=len(seqs), decode_csr=csr, plan=plan)
        tokens = r.sampler.sample(output_logits(loaded.model, last[:, None], ctx, None), seqs)
        t1 = time.perf_counter()
        mx.async_eval(tokens, r.pool.keys, r.pool.values)
        t2 = time.perf_counter()
        mx.synchronize()
        t3 = time.perf_counter()
        builds.append(t1 - t0); encodes.append(t2 - t1); totals.append(t3 - t0)
    out[label] = {"build_ms": 1e3 * float(np.median(builds[2:])), "encode_ms": 1e3 * float(np.median(encodes[2:])),
                  "sync_step_ms": 1e3 * float(np.median(totals[2:])), "path": plan.outcome.kind}
    print(label, json.dumps(out[label]), flush=True)

def engine_at_steady_decode(cascade):
    engine = e2e.make_engine(loaded, batch, 200, cascade, 32, 8192)
    params = e2e.SamplingParams(max_tokens=200, ignore_eos=True)
    seqs = [engine.submit(p, params) for p in batch]
    while not (len(engine.scheduler.running) == 32 and all(s.num_completion_tokens > 4 for s in seqs)):
        engine.step()
    engine._complete(engine._inflight); engine._inflight = None
    mx.synchronize()
    return engine

for cascade in (True, False):
    engine = engine_at_steady_decode(cascade)
    measure(engine, f"{'cascade' if cascade else 'flat'}")
    if cascade:
        for layer in loaded.model.layers:   # the MLP block traced once per layer
            mlp, norm = layer.mlp, layer.post_attention_layernorm
            layer.__dict__["_compiled_mlp"] = mx.compile(lambda h, mlp=mlp, norm=norm: h + mlp(norm(h)))
        import mlx_lm.models.qwen3 as q3
        original = q3.TransformerBlock.__call__
        def call(self, x, mask=None, cache=None):
            h = x + self.self_attn(self.input_layernorm(x), mask, cache)
            return self.__dict__["_compiled_mlp"](h)
        q3.TransformerBlock.__call__ = call
        measure(engine, "cascade, MLP compiled")
        q3.TransformerBlock.__call__ = original
    e2e.release(engine)
json.dump(out, open(sys.argv[1], "w"), indent=1)
