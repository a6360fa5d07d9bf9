"""Decode tok/s and the median host time of full-batch steps, 8 sessions behind a 1,024-token prefix, 64 greedy
tokens (tok/s after each has 16); a digest of every generated token id, so arms can be compared.
usage: MLXCEL_TRACED_LAYERS=off|halves traced_wall.py on|off MODEL_DIR"""
import sys, time, json
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
engine = Engine(loaded, EngineConfig(num_blocks=2048), cascade=CascadeConfig(cascade, 16, 2))
seqs = [engine.submit(p, SamplingParams(max_tokens=64, ignore_eos=True)) for p in prompts]
t0 = None; n0 = 0
while engine.step():
    toks = sum(s.num_completion_tokens for s in seqs)
    if t0 is None and toks >= 16 * 8: t0, n0 = time.perf_counter(), toks
wall = time.perf_counter() - t0
rec = [r for r in engine._recent if r.batch == 8]
print(json.dumps({"cascade": cascade, "tok_s": round((sum(s.num_completion_tokens for s in seqs) - n0) / wall, 1),
  "host_ms": round(1e3 * float(np.median([r.host_seconds for r in rec])), 3),
  "tokens_digest": hash(tuple(t for s in seqs for t in s.token_ids[s.num_prompt_tokens:])) % 10**8,
  "distinct_tokens": len({t for s in seqs for t in s.token_ids[s.num_prompt_tokens:]})}))
