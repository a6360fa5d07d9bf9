"""Per full-batch decode step (8 sessions behind a 1,024-token prefix, 64 greedy tokens, on a pool of NUM_BLOCKS
blocks): wall, and how far MLX's peak memory rose over the active memory, in layer pools (about 1: a K/V store that
copied its layer's pool). usage: [MLXCEL_TRACED_LAYERS=on|off] pool_copies.py on|off MODEL_DIR NUM_BLOCKS"""
import sys, time, os
import mlx.core as mx, numpy as np
from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.model import load_model
from mlxcel.engine.sequence import SamplingParams
cascade = sys.argv[1] == "on"
loaded = load_model(sys.argv[2])
rng = np.random.default_rng(0)
prefix = rng.integers(3, 1000, 1024).tolist()
prompts = [prefix + rng.integers(3, 1000, 16).tolist() for _ in range(8)]
engine = Engine(loaded, EngineConfig(num_blocks=int(sys.argv[3])), cascade=CascadeConfig(cascade, 16, 2))
seqs = [engine.submit(p, SamplingParams(max_tokens=64, ignore_eos=True)) for p in prompts]
layer_bytes = engine.runner.pool.keys[0].nbytes if hasattr(engine, "runner") else None
walls, copies = [], []
while True:
    mx.reset_peak_memory(); base = mx.get_active_memory()
    t = time.perf_counter()
    if not engine.step(): break
    w = (time.perf_counter() - t) * 1e3
    if sum(s.num_completion_tokens for s in seqs) >= 128:
        walls.append(w); copies.append((mx.get_peak_memory() - base) / layer_bytes)
print(f"layer pool {layer_bytes/2**20:.1f} MiB; steps {len(walls)} mean {np.mean(walls):.2f} ms median {np.median(walls):.2f}"
      f" max {max(walls):.1f}; peak rise in layer pools: median {np.median(copies):.2f} max {max(copies):.2f}"
      f" steps over 0.9: {sum(c > 0.9 for c in copies)}")
