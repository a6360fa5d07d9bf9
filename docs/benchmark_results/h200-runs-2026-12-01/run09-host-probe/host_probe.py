"""Where a decode step's host time goes on the H200 machine, under MLX's graph settings (read from the
environment once per process): per full-batch decode step the engine's graph building (runner.forward),
mx.async_eval (MLX encoding the kernels; it blocks once more than 10 committed graphs are in flight), and
the wait for the tokens; cascade and flat on the e2e cell (32 x 8192 shared), the flat arm also on a
server-sized pool. --profile: cProfile of 16 steady cascade steps."""
import cProfile, io, json, os, pstats, statistics, sys, time
from pathlib import Path
import mlx.core as mx
import gpu_e2e_bench as e2e
from mlxcel.engine import runner as runner_module
from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine

label, profile = sys.argv[1], "--profile" in sys.argv
timing = {"forward": [], "async": [], "complete": []}
real_async = mx.async_eval
def timed_async(*a):
    t = time.perf_counter(); real_async(*a); timing["async"].append(time.perf_counter() - t)
mx.async_eval = timed_async
real_forward = runner_module.ModelRunner.forward
def timed_forward(self, *a):
    t = time.perf_counter(); r = real_forward(self, *a); timing["forward"].append(time.perf_counter() - t); return r
runner_module.ModelRunner.forward = timed_forward
real_complete = Engine._complete
def timed_complete(self, inflight):
    t = time.perf_counter(); r = real_complete(self, inflight); timing["complete"].append(time.perf_counter() - t); return r
Engine._complete = timed_complete

_, loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), 36)
batch = e2e.prompts(32, 8192, 32)
e2e.warm_up(loaded, batch, 32, 8192)
out = {"label": label, "env": {k: v for k, v in os.environ.items() if k.startswith("MLX_")}}

def arm(name, cascade, blocks=None):
    engine = e2e.make_engine(loaded, batch, 64, cascade, 32, 8192)
    if blocks:
        engine = Engine(loaded, EngineConfig(block_size=32, num_blocks=blocks, max_running=32, max_batched_tokens=2048),
                        cascade=CascadeConfig(enabled=cascade, min_shared_pages=16, min_members=2))
    params = e2e.SamplingParams(max_tokens=64, ignore_eos=True)
    seqs = [engine.submit(p, params) for p in batch]
    rows, prof, profiled = [], None, 0
    while True:
        for v in timing.values(): v.clear()
        steady = len(engine.scheduler.running) == 32 and not engine.scheduler.prefilling
        if profile and cascade and steady and prof is None and len(rows) == 8:
            prof = cProfile.Profile(); prof.enable()
        t = time.perf_counter()
        if not engine.step():
            break
        wall = time.perf_counter() - t
        if prof and (profiled := profiled + 1) == 16:
            prof.disable(); s = io.StringIO()
            st = pstats.Stats(prof, stream=s); st.sort_stats("tottime").print_stats(45)
            st.sort_stats("cumulative").print_stats(45); out[name + "_cprofile"] = s.getvalue(); prof = False
        if steady and timing["forward"] and timing["complete"] and not prof:
            rows.append({k: 1e3 * sum(v) for k, v in timing.items()} | {"wall": 1e3 * wall})
    e2e.release(engine)
    rows = rows[4:-2]
    med = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
    med["other"] = round(med["wall"] - med["forward"] - med["async"] - med["complete"], 3)
    med["steps"] = len(rows)
    out[name] = med
    print(label, name, json.dumps(med), flush=True)
    return [s.completion_token_ids for s in seqs]

tok_c = arm("cascade", True)
tok_f = arm("flat", False)
arm("flat_bigpool", False, blocks=8000)
arm("cascade_bigpool", True, blocks=8000)
out["cascade_flat_same_tokens"] = tok_c == tok_f
print(label, "tokens identical cascade/flat:", tok_c == tok_f)
for k, v in out.items():
    if k.endswith("_cprofile"):
        print(v)
Path(os.environ.get("OUT", "/tmp"), f"probe-{label}.json").write_text(json.dumps(out, indent=1))
