"""Whole-layer traces against traced halves, interleaved in one process (the H200 host's speed drifts by up to
1.5x over a run, so arms read minutes apart do not compare): per round a cascade arm with MLXCEL_TRACED_LAYERS
whole, one with halves, and a flat arm, on the e2e cell (32 x 8192 shared); per full-batch decode step the
graph build (runner.forward), mx.async_eval (MLX encoding; it blocks once more than 10 committed graphs are in
flight) and the wait for the tokens. Then a cProfile of 16 steady whole-mode cascade steps."""
import cProfile, io, json, os, statistics, sys, time, pstats
from pathlib import Path
import mlx.core as mx
import gpu_e2e_bench as e2e
from mlxcel.engine import runner as runner_module
from mlxcel.engine.engine import Engine

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
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
for mode in ("whole", "halves"):
    os.environ["MLXCEL_TRACED_LAYERS"] = mode
    e2e.warm_up(loaded, batch, 32, 8192)
out = {"reads": []}

def arm(name, mode, cascade, new_tokens=64, profile=False):
    os.environ["MLXCEL_TRACED_LAYERS"] = mode
    engine = e2e.make_engine(loaded, batch, new_tokens, cascade, 32, 8192)
    seqs = [engine.submit(p, e2e.SamplingParams(max_tokens=new_tokens, ignore_eos=True)) for p in batch]
    rows, prof = [], None
    while True:
        for v in timing.values(): v.clear()
        steady = len(engine.scheduler.running) == 32 and not engine.scheduler.prefilling
        if profile and steady and prof is None and len(rows) == 8:
            prof = cProfile.Profile(); prof.enable()
        t = time.perf_counter()
        if not engine.step():
            break
        wall = time.perf_counter() - t
        if steady and timing["forward"] and timing["complete"]:
            rows.append({k: 1e3 * sum(v) for k, v in timing.items()} | {"wall": 1e3 * wall})
        if prof and len(rows) == 24:
            prof.disable(); s = io.StringIO()
            st = pstats.Stats(prof, stream=s); st.sort_stats("tottime").print_stats(40)
            st.sort_stats("cumulative").print_stats(40); out["whole_cprofile"] = s.getvalue(); prof = False
    launches = engine.metrics.registry.get_sample_value("mlxcel_paged_decode_launches_total", {"path": "cascade"})
    e2e.release(engine)
    rows = rows[4:-2]
    med = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
    med |= {"other": round(med["wall"] - med["forward"] - med["async"] - med["complete"], 3), "steps": len(rows),
            "cascade_layer_launches": launches, "arm": name}
    out["reads"].append(med)
    print(name, json.dumps(med), flush=True)
    return [s.completion_token_ids for s in seqs]

tokens = {}
for r in range(rounds):
    order = [("whole", "whole", True), ("halves", "halves", True), ("flat", "whole", False)]
    for name, mode, cascade in (order if r % 2 == 0 else order[::-1]):
        got = arm(name, mode, cascade)
        assert tokens.setdefault(name, got) == got
out["same_tokens"] = {"whole_vs_halves": tokens["whole"] == tokens["halves"], "whole_vs_flat": tokens["whole"] == tokens["flat"]}
print("tokens", json.dumps(out["same_tokens"]), flush=True)
arm("whole_profiled", "whole", True, profile=True)
print(out.get("whole_cprofile", ""))
Path(os.environ.get("OUT", "/tmp"), "trace_probe.json").write_text(json.dumps(out, indent=1))
