"""Host time of a decode step with the device idle while the host builds: the old (synchronous) engine's
wall time of engine.step() minus its time in mx.eval; the new engine's step record host_seconds (scheduling,
planning, building the graph) with the in-flight step evaluated before the next is built, so the build
never shares the two cores with MLX's compute. 8 sessions behind a 1,024-token prefix, 48 greedy tokens,
the full-batch steps. usage: host_idle.py old|new on|off MODEL_DIR"""
import json
import sys
import time

import mlx.core as mx
import numpy as np

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
        t = time.perf_counter()
        real(*a)
        blocked.append(time.perf_counter() - t)
    runner.mx.eval = timed
seqs = [engine.submit(p, SamplingParams(max_tokens=48, ignore_eos=True)) for p in prompts]
host = []
while True:
    n0 = sum(s.num_completion_tokens for s in seqs)
    blocked.clear()
    t = time.perf_counter()
    if not engine.step():
        break
    wall = time.perf_counter() - t
    if which == "new" and engine._inflight is not None:
        mx.eval(engine._inflight.launched.tokens)      # the device idle while the next step is built
    full = sum(s.num_completion_tokens for s in seqs) - n0 == len(seqs)
    if which == "old" and full:
        host.append(wall - sum(blocked))
    elif which == "new" and full and engine._recent[-1].batch == len(seqs):
        host.append(engine._recent[-1].host_seconds)
print(json.dumps({"engine": which, "cascade": cascade, "steps": len(host),
                  "host_ms_median": round(1e3 * float(np.median(host)), 3)}))
