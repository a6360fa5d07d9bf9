"""The skinny matmul against cuBLAS in the engine, interleaved in one process (the H200 host's speed drifts
between processes): per round a cascade arm with MLXCEL_MATMUL unset (skinny in its whole-layer traces), one
with cublas, a flat arm (cuBLAS) and a flat arm with skinny everywhere, on the e2e cell (32 x 8192 shared).
Per full-batch decode step: wall, graph build (runner.forward), mx.async_eval (encoding), the wait for the
tokens; per arm, 8 steady steps under PyTorch's profiler: GPU busy (union of kernel intervals) and kernels
a step."""
import json, os, statistics, sys, time
from pathlib import Path
import mlx.core as mx
from torch.profiler import ProfilerActivity, profile
import gpu_e2e_bench as e2e
from gpu_timeline import complete_events, union_length
from mlxcel.engine import runner as runner_module
from mlxcel.engine.engine import Engine

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
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
for matmul in ("", "cublas"):
    os.environ["MLXCEL_MATMUL"] = matmul
    e2e.warm_up(loaded, batch, 32, 8192)
out = {"reads": [], "gpu": {}}

def arm(name, matmul, cascade, new_tokens=64, profiled=False):
    os.environ["MLXCEL_MATMUL"] = matmul
    engine = e2e.make_engine(loaded, batch, new_tokens, cascade, 32, 8192)
    seqs = [engine.submit(p, e2e.SamplingParams(max_tokens=new_tokens, ignore_eos=True)) for p in batch]
    rows, prof, window = [], None, []
    while True:
        for v in timing.values(): v.clear()
        steady = len(engine.scheduler.running) == 32 and not engine.scheduler.prefilling
        if profiled and steady and prof is None and len(rows) == 12:
            prof = profile(activities=[ProfilerActivity.CUDA]); prof.__enter__(); t0 = time.perf_counter()
        t = time.perf_counter()
        if not engine.step():
            break
        wall = time.perf_counter() - t
        if steady and timing["forward"] and timing["complete"]:
            rows.append({k: 1e3 * sum(v) for k, v in timing.items()} | {"wall": 1e3 * wall})
        if prof and len(rows) == 20:
            mx.synchronize(); span = time.perf_counter() - t0; prof.__exit__(None, None, None)
            kernels = [(e["ts"], e["ts"] + e["dur"]) for e in complete_events(prof) if e.get("cat") == "kernel"]
            out["gpu"][name] = {"busy_ms_per_step": union_length(kernels) / 8 / 1e3,
                                "wall_ms_per_step": span / 8 * 1e3, "kernels_per_step": len(kernels) / 8}
            print(name, "gpu", json.dumps(out["gpu"][name]), flush=True)
            prof = False
    e2e.release(engine)
    rows = rows[4:-2]
    med = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
    med |= {"steps": len(rows), "arm": name}
    out["reads"].append(med)
    print(name, json.dumps(med), flush=True)
    return [s.completion_token_ids for s in seqs]

tokens = {}
order = [("cascade_skinny", "", True), ("cascade_cublas", "cublas", True), ("flat", "", False),
         ("flat_skinny", "skinny", False)]
for r in range(rounds):
    for name, matmul, cascade in (order if r % 2 == 0 else order[::-1]):
        got = arm(name, matmul, cascade)
        assert tokens.setdefault(name, got) == got
ref = tokens["flat"]
out["rows_identical_to_flat"] = {name: sum(a == b for a, b in zip(t, ref)) for name, t in tokens.items()}
print("tokens", json.dumps(out["rows_identical_to_flat"]), flush=True)
for name, matmul, cascade in order:
    arm(name, matmul, cascade, profiled=True)
Path(os.environ.get("OUT", "/tmp"), "matmul_probe.json").write_text(json.dumps(out, indent=1))
