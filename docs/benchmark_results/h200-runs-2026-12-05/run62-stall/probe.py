"""Where the first cascade read of the 32 x 32K cell loses ~7 s (runs 59-61): the cell's warm-up (16 tokens an arm,
as gpu_e2e_bench.py's), then one cascade read of 96 tokens with each engine step timed; for every step over 0.2 s its
batch, the whole-layer traces made during it (LayerHalves.traced_whole's misses) and the kernels NVRTC built (new
files in MLX_PTX_CACHE_DIR). A second cascade read after it shows what a warm process does."""
import json
import os
import sys
import time
from pathlib import Path

import gpu_e2e_bench as bench
from mlxcel.engine import layer_halves

out = Path(sys.argv[1])
SHARED, NEW = int(os.environ.get("PROBE_SHARED", 32768)), int(os.environ.get("PROBE_NEW", 96))   # smaller: a CPU smoke run
ptx = Path(os.environ.get("MLX_PTX_CACHE_DIR", "/tmp/ptx"))
misses = []
real = layer_halves.LayerHalves.traced_whole


def counted(self, ops, attention):
    if (ops, attention.signature) not in self._whole:
        misses.append(attention.signature)
    return real(self, ops, attention)


layer_halves.LayerHalves.traced_whole = counted
stock, loaded = bench.random_models(Path("/tmp/qwen3-8b-random"), int(os.environ.get("PROBE_LAYERS", 36)))
batch = bench.prompts(32, SHARED, 32)
bench.warm_up(loaded, batch, 32, SHARED)
report = {}
for read in ("first", "second"):
    engine = bench.make_engine(loaded, batch, NEW, True, 32, SHARED)
    seqs = [engine.submit(p, bench.SamplingParams(max_tokens=NEW, ignore_eos=True)) for p in batch]
    slow, index = [], 0
    while True:
        files, before = set(os.listdir(ptx)) if ptx.exists() else set(), len(misses)
        decode_rows = len(engine.scheduler.running)
        start = time.perf_counter()
        if not engine.step():
            break
        seconds = time.perf_counter() - start
        if seconds > 0.2:
            built = sorted(set(os.listdir(ptx)) - files) if ptx.exists() else []
            slow.append({"step": index, "seconds": round(seconds, 3), "decoding_rows_before": decode_rows,
                         "new_traces": len(misses) - before,
                         "new_signatures": len({repr(s) for s in misses[before:]}), "kernels_built": built,
                         "completion_tokens": sum(s.num_completion_tokens for s in seqs)})
        index += 1
    bench.release(engine)
    report[read] = {"steps": index, "slow_steps": slow}
    print(read, json.dumps(report[read]), flush=True)
    (out / "probe.json").write_text(json.dumps(report, indent=1))
