"""One 32K-token prompt prefilled on the Qwen3-8B-shaped model (chunks of 2,048), its attention in blocks of query
tokens (main) and whole (PREFILL_SCORE_ELEMENTS unbounded: the code before), in that order: MLX's peak memory,
the prefill's wall time and the first tokens of each. python probe.py"""
import json
import time
from pathlib import Path

import mlx.core as mx

import gpu_e2e_bench as e2e
from mlxcel.engine import attention
from mlxcel.engine.sequence import SamplingParams

stock, loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])
del stock
prompt = e2e.prompts(1, 32768, 32, vocab=loaded.vocab_size)[0]
first = None
for state, budget in (("blocks", attention.PREFILL_SCORE_ELEMENTS), ("whole", 1 << 62)):
    attention.PREFILL_SCORE_ELEMENTS = budget
    mx.clear_cache()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    engine = e2e.make_engine(loaded, [prompt], 4, False, 32, 0)
    seq = engine.submit(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    start = time.perf_counter()
    while engine.step():
        pass
    wall = time.perf_counter() - start
    tokens = seq.token_ids[len(prompt):]
    first = first or tokens
    print(json.dumps({"state": state, "finish": seq.finish_reason, "wall_s": round(wall, 2),
                      "peak_gb": round(mx.get_peak_memory() / 1e9, 2), "before_gb": round(base / 1e9, 2),
                      "tokens": tokens, "same_tokens": tokens == first}), flush=True)
    e2e.release(engine)
