"""Median host ms of 30 full-batch decode steps (tiny model, 32 sessions behind a 2048-token prefix).
usage: host_step.py on|off TREE [prof]  (TREE: the checkout whose benchmarks/ to import; prof: cProfile too)"""
import cProfile, pstats, sys, time
sys.path.insert(0, sys.argv[2] + "/benchmarks")
import mlx.core as mx
import gpu_e2e_bench as e2e
from mlxcel.engine.model import load_model
from mlxcel.engine.builtin_models import tiny_model_path
from mlxcel.engine.sequence import SamplingParams
loaded = load_model(tiny_model_path())
cascade = sys.argv[1] == "on"
batch = e2e.prompts(32, 2048, 32, vocab=loaded.vocab_size)
engine = e2e.make_engine(loaded, batch, 64, cascade, 32, 2048)
params = SamplingParams(max_tokens=64, ignore_eos=True)
seqs = [engine.submit(p, params) for p in batch]
while engine.scheduler.prefilling or len(engine.scheduler.running) < 32 or any(s.num_completion_tokens < 4 for s in seqs):
    engine.step()
prof = len(sys.argv) > 3 and sys.argv[3] == "prof"
pr = cProfile.Profile()
if prof: pr.enable()
for _ in range(30):
    engine.step()
if prof: pr.disable()
recs = [r for r in engine.snapshot.recent_steps if r.kind == "decode" and r.batch == 32][-30:]
import statistics
print("host ms", statistics.median(r.host_seconds for r in recs) * 1e3, "wall", statistics.median(r.seconds for r in recs) * 1e3)
if prof: st = pstats.Stats(pr); st.sort_stats("cumulative").print_stats(60)
