"""Decode step of the default model (SmolLM2-135M-Instruct, float32): SESSIONS prompts behind a 512-token prefix,
a warm-up read of 8 tokens, then 64 greedy tokens; the median wall and host time of the last 40 full-batch decode
steps, tok/s from the median step, and a digest of every token id (arms must agree).
usage: smollm2_decode.py MODEL_DIR SESSIONS"""
import sys, time, json
import mlx.core as mx, numpy as np
from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.model import load_model
from mlxcel.engine.sequence import SamplingParams
loaded = load_model(sys.argv[1])
n = int(sys.argv[2])
rng = np.random.default_rng(0)
prefix = rng.integers(3, 40000, 512).tolist()
prompts = [prefix + rng.integers(3, 40000, 16).tolist() for _ in range(n)]
engine = Engine(loaded, EngineConfig(num_blocks=1024), cascade=CascadeConfig(True, 16, 2))
warm = [engine.submit(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in prompts]
while engine.step(): pass
seqs = [engine.submit(p, SamplingParams(max_tokens=64, ignore_eos=True)) for p in prompts]
while engine.step(): pass
rec = [r for r in list(engine._recent) if r.batch == n and r.kind == "decode"][-40:]
f = lambda xs: round(1e3 * float(np.median(xs)), 3)
print(json.dumps({"sessions": n, "wall_ms": f([r.seconds for r in rec]), "host_ms": f([r.host_seconds for r in rec]),
                  "tok_s": round(n / np.median([r.seconds for r in rec]), 1),
                  "digest": hash(tuple(t for s in seqs for t in s.token_ids)) % 10**8}))
