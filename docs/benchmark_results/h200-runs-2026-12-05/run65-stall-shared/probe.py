"""Run 62's probe again with the layers sharing their traces: does the first cascade read of the 32 x 32K cell
still lose seconds in one step once a new attention signature makes one trace, not 36? The cell's warm-up as run
62's (16 tokens an arm), then two cascade reads of 96 tokens, each engine step timed; for every step over 0.2 s:
its batch, the traces made in it, new files in MLX_PTX_CACHE_DIR, the engine's records of the steps read back in it
and of the step it launched (host: scheduling, planning, building the graph; device: MLX's encoding and the wait),
MLX's active and cache memory after it and the cache clears so far. usage: probe.py OUT_DIR"""
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import mlx.core as mx

import gpu_e2e_bench as bench
from mlxcel.engine import layer_halves

out = Path(sys.argv[1])
SHARED, NEW = int(os.environ.get("PROBE_SHARED", 32768)), int(os.environ.get("PROBE_NEW", 96))
ptx = Path(os.environ.get("MLX_PTX_CACHE_DIR", "/tmp/ptx"))
made = []
traced_whole = layer_halves.whole
layer_halves.whole = lambda *a: made.append(1) or traced_whole(*a)
stock, loaded = bench.random_models(Path("/tmp/qwen3-8b-random"), int(os.environ.get("PROBE_LAYERS", 36)))
batch = bench.prompts(32, SHARED, 32)
bench.warm_up(loaded, batch, 32, SHARED, new_tokens=16)
report = {}
for read in ("first", "second"):
    engine = bench.make_engine(loaded, batch, NEW, True, 32, SHARED)
    seqs = [engine.submit(p, bench.SamplingParams(max_tokens=NEW, ignore_eos=True)) for p in batch]
    slow, index, waiting = [], 0, None
    while True:
        files, before = set(os.listdir(ptx)) if ptx.exists() else set(), len(made)
        decode_rows = len(engine.scheduler.running)
        start = time.perf_counter()
        if not engine.step():
            break
        seconds = time.perf_counter() - start
        if waiting is not None:     # the step the slow call launched, recorded once this call read it back
            waiting["launched_record"] = asdict(engine._recent[-1])
            waiting = None
        if seconds > 0.2:
            built = sorted(set(os.listdir(ptx)) - files) if ptx.exists() else []
            slow.append({"step": index, "seconds": round(seconds, 3), "decoding_rows_before": decode_rows,
                         "traces_made": len(made) - before, "kernels_built": built,
                         "records": [asdict(r) for r in list(engine._recent)[-2:]],
                         "active_gb": mx.get_active_memory() / 1e9, "cache_gb": mx.get_cache_memory() / 1e9,
                         "cache_clears": engine.metrics.registry.get_sample_value("mlxcel_mlx_cache_clears_total"),
                         "completion_tokens": sum(s.num_completion_tokens for s in seqs)})
            waiting = slow[-1]
        index += 1
    bench.release(engine)
    report[read] = {"steps": index, "slow_steps": slow}
    print(read, json.dumps({"steps": index, "slow": [(s["step"], s["seconds"], s["traces_made"]) for s in slow]}),
          flush=True)
    (out / "probe.json").write_text(json.dumps(report, indent=1))
