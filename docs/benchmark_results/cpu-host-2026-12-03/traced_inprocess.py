"""Traced against untraced CPU decode in one process: an engine per MLXCEL_TRACED_LAYERS mode (the modes in the
order given), N sessions behind a 1,024-token prefix, blocks of 8 steps of each engine in turn (its first step
after the other's block refills its pipeline, not timed), 12 blocks; tok/s of each block, median and mean, and
the median step's host and device (MLX: encoding and running the kernels) ms of the timed steps.
usage: [AB_MODEL=DIR AB_N=N] traced_inprocess.py on|off MODE MODE (cascade on or off; MODE on or off)"""
import os, sys, time
import mlx.core as mx, numpy as np
from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.model import load_model
from mlxcel.engine.sequence import SamplingParams
cascade = sys.argv[1] == "on"
MODEL = os.environ.get("AB_MODEL", "/root/.cache/mlxcel/models/tiny-qwen3-v2")
N = int(os.environ.get("AB_N", "8"))
V = 40000 if "smol" in MODEL else 1000   # prompt token ids under the vocabulary
loaded = load_model(MODEL)
rng = np.random.default_rng(0)
prefix = rng.integers(3, V, 1024).tolist()
prompts = [prefix + rng.integers(3, V, 16).tolist() for _ in range(N)]
engines = {}
for mode in sys.argv[2:]:
    os.environ["MLXCEL_TRACED_LAYERS"] = mode
    e = Engine(loaded, EngineConfig(num_blocks=2048), cascade=CascadeConfig(cascade, 16, 2))
    seqs = [e.submit(p, SamplingParams(max_tokens=400, ignore_eos=True)) for p in prompts]
    engines[mode] = (e, seqs)
for mode, (e, seqs) in engines.items():
    while not all(s.num_completion_tokens > 4 for s in seqs): e.step()
walls = {m: [] for m in engines}
steps = {m: [] for m in engines}
for block in range(12):
    for mode, (e, seqs) in engines.items():
        e.step()                      # the pipeline refills
        n0 = sum(s.num_completion_tokens for s in seqs); t = time.perf_counter()
        for _ in range(8): e.step()
        walls[mode].append((sum(s.num_completion_tokens for s in seqs) - n0) / (time.perf_counter() - t))
        steps[mode] += list(e._recent)[-8:]
for m, w in walls.items():
    host, device = (round(1e3 * float(np.median([getattr(r, f) for r in steps[m]])), 2)
                    for f in ("host_seconds", "device_seconds"))
    print(m, "tok/s median", round(np.median(w), 1), "mean", round(np.mean(w), 1), "host ms", host, "device ms", device)
# The arms' tokens (greedy, the same prompts): each row's over the length both generated, and how many ids occur.
(_, first), (_, second) = list(engines.values())[:2]
common = [min(a.num_completion_tokens, b.num_completion_tokens) for a, b in zip(first, second)]
same = sum(a.token_ids[a.num_prompt_tokens:][:n] == b.token_ids[b.num_prompt_tokens:][:n]
           for a, b, n in zip(first, second, common))
print(f"tokens: {same} of {len(first)} rows the same over {min(common)}+ tokens each; "
      f"{len({t for s in first for t in s.token_ids[s.num_prompt_tokens:]})} distinct ids")
