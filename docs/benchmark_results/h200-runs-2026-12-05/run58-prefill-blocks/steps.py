"""Memory after each step of one 32K prompt's prefill (chunks of 2,048) on the Qwen3-8B-shaped model, the device
synchronized after each: MLX's active, cache and peak GB. python steps.py"""
import json
import time
from pathlib import Path

import mlx.core as mx

import gpu_e2e_bench as e2e
from mlxcel.engine.sequence import SamplingParams

stock, loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), e2e.QWEN3_8B["num_layers"])
del stock
prompt = e2e.prompts(1, 32768, 32, vocab=loaded.vocab_size)[0]
engine = e2e.make_engine(loaded, [prompt], 4, False, 32, 0)
seq = engine.submit(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
step = 0
while True:
    start = time.perf_counter()
    more = engine.step()
    mx.synchronize()
    print(json.dumps({"step": step, "cached": seq.num_cached_tokens, "s": round(time.perf_counter() - start, 3),
                      "active_gb": round(mx.get_active_memory() / 1e9, 2), "cache_gb": round(mx.get_cache_memory() / 1e9, 2),
                      "peak_gb": round(mx.get_peak_memory() / 1e9, 2), "finish": seq.finish_reason}), flush=True)
    step += 1
    if not more or seq.finish_reason:
        break
print(json.dumps({"tokens": seq.token_ids[len(prompt):]}))
