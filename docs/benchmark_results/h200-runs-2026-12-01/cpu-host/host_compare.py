"""Host time per decode step, old (synchronous) and new engine, same harness:
host = wall time of engine.step() minus the time blocked in MLX (old: mx.eval;
new: the step record's device time, async_eval + waiting for its tokens)."""
import sys, time, json
import numpy as np, mlx.core as mx
from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.model import load_model
from mlxcel.engine.sequence import SamplingParams

which, cascade, model = sys.argv[1], sys.argv[2] == "on", sys.argv[3]
loaded = load_model(model)
rng = np.random.default_rng(0)
prefix = rng.integers(3, 1000, 1024).tolist()
prompts = [prefix + rng.integers(3, 1000, 16).tolist() for _ in range(8)]
engine = Engine(loaded, EngineConfig(num_blocks=2048), cascade=CascadeConfig(cascade, 16, 2))
blocked = []
if which == "old":
    from mlxcel.engine import runner
    real = runner.mx.eval
    def timed(*a):
        t = time.perf_counter(); real(*a); blocked.append(time.perf_counter() - t)
    runner.mx.eval = timed
seqs = [engine.submit(p, SamplingParams(max_tokens=48, ignore_eos=True)) for p in prompts]
walls = []
while True:
    n0 = sum(s.num_completion_tokens for s in seqs); blocked.clear()
    t = time.perf_counter()
    if not engine.step():
        break
    wall = time.perf_counter() - t
    if sum(s.num_completion_tokens for s in seqs) - n0 == len(seqs):
        if which == "old":
            walls.append((wall, sum(blocked)))
        else:
            walls.append((wall, engine._recent[-1].device_seconds))
host = [w - b for w, b in walls]
print(json.dumps({"engine": which, "cascade": cascade, "steps": len(walls),
                  "host_ms_median": 1e3 * float(np.median(host)), "wall_ms_median": 1e3 * float(np.median([w for w, _ in walls]))}))
