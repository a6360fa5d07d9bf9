"""Wall time of each full-batch decode step (after each row has 16 tokens), 8 sessions behind a 1,024-token prefix,
64 greedy tokens, on a pool of NUM_BLOCKS blocks; SYNC_EVAL=1 evaluates each step before the next is built.
usage: [SYNC_EVAL=1] [MLXCEL_TRACED_LAYERS=on|off] step_walls.py on|off MODEL_DIR NUM_BLOCKS"""
import sys, time, json
import mlx.core as mx, numpy as np
from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.model import load_model
from mlxcel.engine.sequence import SamplingParams
cascade = sys.argv[1] == "on"
import os
if os.environ.get("SYNC_EVAL"):
    from mlxcel.engine import runner as _r; _r.mx.async_eval = mx.eval
loaded = load_model(sys.argv[2])
rng = np.random.default_rng(0)
prefix = rng.integers(3, 1000, 1024).tolist()
prompts = [prefix + rng.integers(3, 1000, 16).tolist() for _ in range(8)]
engine = Engine(loaded, EngineConfig(num_blocks=int(sys.argv[3])), cascade=CascadeConfig(cascade, 16, 2))
seqs = [engine.submit(p, SamplingParams(max_tokens=64, ignore_eos=True)) for p in prompts]
walls = []
while True:
    t = time.perf_counter()
    if not engine.step(): break
    walls.append((round((time.perf_counter() - t) * 1e3, 1), sum(s.num_completion_tokens for s in seqs)))
print([w for w, n in walls if n >= 128])
