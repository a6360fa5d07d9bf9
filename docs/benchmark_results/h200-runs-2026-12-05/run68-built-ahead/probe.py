"""Run 67's probe with the engine building its projection kernels of every row count when it starts
(ModelRunner.build_kernels): the first engine's construction timed, then as run 67. 32 x 8K,
a warm-up of 16 tokens an arm (rows join one a step, so no decode-only step holds more than ~16 rows), then
three reads of 48 tokens in one process, each meeting its first decode-only steps of 17-32 rows: cascade with
cuBLAS projections (MLXCEL_MATMUL=cublas: the attention's instances), cascade as served (the skinny matmul's
instances on top), flat. Per read: steps over 0.2 s, the engine's host and MLX's device seconds of the step each
launched. usage: probe.py OUT_DIR"""
import json
import os
import sys
import time
from pathlib import Path

import gpu_e2e_bench as bench

out = Path(sys.argv[1])
SHARED = int(os.environ.get("PROBE_SHARED", 8192))
stock, loaded = bench.random_models(Path("/tmp/qwen3-8b-random"), int(os.environ.get("PROBE_LAYERS", 36)))
batch = bench.prompts(32, SHARED, 32)
start = time.perf_counter()
bench.release(bench.make_engine(loaded, batch, 16, True, 32, SHARED))   # the process's first engine: builds them
report = {"first_engine_s": round(time.perf_counter() - start, 2)}
print("first engine", report["first_engine_s"], "s", flush=True)
bench.warm_up(loaded, batch, 32, SHARED, new_tokens=16)
for name, cascade, matmul in (("cascade_cublas", True, "cublas"), ("cascade", True, "auto"), ("flat", False, "auto")):
    with bench.matmul_env(matmul):
        engine = bench.make_engine(loaded, batch, 48, cascade, 32, SHARED)
        seqs = [engine.submit(p, bench.SamplingParams(max_tokens=48, ignore_eos=True)) for p in batch]
        slow, waiting, index = [], None, 0
        while True:
            start = time.perf_counter()
            if not engine.step():
                break
            seconds = time.perf_counter() - start
            if waiting is not None:
                record = engine._recent[-1]
                waiting.update(launched_batch=record.batch, launched_prefill_tokens=record.prefill_tokens,
                               host_s=round(record.host_seconds, 4), device_s=round(record.device_seconds, 3))
                waiting = None
            if seconds > 0.2 and index > 20:     # past the prefill steps
                slow.append({"step": index, "seconds": round(seconds, 3)})
                waiting = slow[-1]
            index += 1
        bench.release(engine)
    report[name] = slow
    print(name, json.dumps(slow), flush=True)
    (out / "probe.json").write_text(json.dumps(report, indent=1))
