"""Per-step medians of the engine's host parts (timers around each function), same workload as host_step.py.
usage: [SYNC=1] host_parts.py on|off TREE [small MODEL_DIR]  (SYNC=1: the device idle while the host builds)"""
import sys, time, collections, statistics
sys.path.insert(0, sys.argv[2] + "/benchmarks")
import mlx.core as mx
import gpu_e2e_bench as e2e
from mlxcel.engine.model import load_model
from mlxcel.engine.builtin_models import tiny_model_path
from mlxcel.engine.sequence import SamplingParams
import importlib
acc = collections.defaultdict(float)
on = [False]
def wrap(modname, qual):
    mod = importlib.import_module(modname)
    parts = qual.split(".")
    owner = mod
    for p in parts[:-1]:
        owner = getattr(owner, p)
    f = getattr(owner, parts[-1])
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            if on[0]:
                acc[qual] += time.perf_counter() - t
    setattr(owner, parts[-1], w)
    return f
for m, q in [("mlxcel.engine.scheduler", "Scheduler.schedule"), ("mlxcel.engine.step_inputs", "StepInputs.of"),
             ("mlxcel.kernels.csr", "CsrBuilder.build"), ("mlxcel.engine.decode_plan", "DecodePlanner.plan"),
             ("mlxcel.engine.runner", "final_hidden"), ("mlxcel.engine.runner", "head_logits"),
             ("mlxcel.engine.sampler", "Sampler.sample"), ("mlxcel.engine.engine", "Engine._postprocess"),
             ("mlxcel.engine.engine", "Engine._record"), ("mlxcel.engine.engine", "Engine._advance"),
             ("mlxcel.engine.engine", "Engine._plan_view"), ("mlxcel.engine.metrics", "EngineMetrics.record_decode"),
             ("mlxcel.engine.runner", "upload"), ("mlxcel.engine.engine", "Engine._last_tokens"),
             ("mlxcel.engine.attention", "levels_key"), ("mlxcel.engine.attention", "cascade_layout"),
             ("mlxcel.engine.attention", "private_level"), ("mlxcel.engine.attention", "padded_indices"),
             ("mlxcel.engine.attention", "upload"), ("mlxcel.kernels", "prepare_cascade"), ("mlxcel.kernels", "prepare_partial"),
             ("mlxcel.engine.decode_plan", "decide_step"), ("mlxcel.kernels.csr", "host_csr"), ("mlxcel.kernels.csr", "grew_from"),
             ("mlxcel.kernels.csr", "PagedCsrView.from_host"), ("mlxcel.kernels.portable", "page_tiles"), ("mlxcel.kernels.portable", "merge_layout"),
             ("mlxcel.engine.attention", "prepare_flat_launch"), ("mlxcel.engine.attention", "CascadeLayout.private_view"),
             ("mlxcel.engine.model", "StepContext"),
             ("mlxcel.engine.engine", "Engine._drain_inbox")]:
    wrap(m, q)
small = len(sys.argv) > 3 and sys.argv[3] == "small"
cascade = sys.argv[1] == "on"
if small:
    import numpy as np
    from mlxcel.engine.config import CascadeConfig, EngineConfig
    from mlxcel.engine.engine import Engine
    loaded = load_model(sys.argv[4])
    rng = np.random.default_rng(0)
    prefix = rng.integers(3, 1000, 1024).tolist()
    batch = [prefix + rng.integers(3, 1000, 16).tolist() for _ in range(8)]
    engine = Engine(loaded, EngineConfig(num_blocks=2048), cascade=CascadeConfig(cascade, 16, 2))
    seqs = [engine.submit(p, SamplingParams(max_tokens=48, ignore_eos=True)) for p in batch]
    N, B = 30, 8
else:
    loaded = load_model(tiny_model_path())
    batch = e2e.prompts(32, 2048, 32, vocab=loaded.vocab_size)
    engine = e2e.make_engine(loaded, batch, 64, cascade, 32, 2048)
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    seqs = [engine.submit(p, params) for p in batch]
    N, B = 30, 32
while engine.scheduler.prefilling or len(engine.scheduler.running) < B or any(s.num_completion_tokens < 4 for s in seqs):
    engine.step()
import os
sync = os.environ.get("SYNC") == "1"
on[0] = True
steps = []
for _ in range(N):
    acc.clear()
    engine.step()
    steps.append(dict(acc))
    if sync and engine._inflight is not None:
        on[0] = False
        mx.eval(engine._inflight.launched.tokens)
        on[0] = True
on[0] = False
recs = [r for r in engine.snapshot.recent_steps if r.kind == "decode" and r.batch == B][-N:]
print("host ms", statistics.median(r.host_seconds for r in recs) * 1e3)
names = {k for st in steps for k in st}
med = {k: statistics.median(st.get(k, 0.0) for st in steps) for k in names}
mean = {k: statistics.mean(st.get(k, 0.0) for st in steps) for k in names}
for k in sorted(names, key=lambda k: -med[k]):
    print(f"{k:35s} median {med[k] * 1e3:.3f} ms  mean {mean[k] * 1e3:.3f}")
