"""The 32 x 32K cell with MLX's buffer cache trimmed between steps (engine/buffer_cache.py) against left as MLX
keeps it, cascade and flat, bf16 pages, in one process (A B B A). Per arm: median step, host and device ms, the
trims, MLX's active and cache memory after the prefill and at the end; tokens compared across arms."""
import json
import os
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

import gpu_e2e_bench as bench
from mlxcel.engine import buffer_cache

out = Path(sys.argv[1])
SHARED, NEW = int(os.environ.get("PROBE_SHARED", 32768)), 96   # smaller for a CPU smoke run
real_trim = buffer_cache.trim
trims = []


def counted():
    done = real_trim()
    if done:
        trims.append(time.perf_counter())
    return done


stock, loaded = bench.random_models(Path("/tmp/qwen3-8b-random"), int(os.environ.get("PROBE_LAYERS", 36)))
batch = bench.prompts(32, SHARED, 32)
report = {"memory_limit_gb": mx.get_memory_limit() / 1e9}


def arm(cascade: bool, trim: bool) -> dict:
    buffer_cache.trim = counted if trim else (lambda: False)
    trims.clear()
    engine = bench.make_engine(loaded, batch, NEW, cascade, 32, SHARED)
    memory = []

    def each_step(engine, index):
        if index in (40, 100):
            memory.append({"step": index, "active_gb": mx.get_active_memory() / 1e9,
                           "cache_gb": mx.get_cache_memory() / 1e9})
    result = bench.run_engine(engine, batch, NEW, each_step)
    records = [r for r in engine.snapshot.recent_steps if r.kind == "decode" and r.batch == len(batch)]
    bench.release(engine)
    return {**{k: v for k, v in result.items()}, "trims": len(trims), "memory": memory,
            "host_ms_each": [round(1e3 * r.host_seconds, 2) for r in records]}


buffer_cache.trim = lambda: False
bench.engine_arm(loaded, batch, 16, True, 32, SHARED)     # warm-up: kernels and traces
bench.engine_arm(loaded, batch, 16, False, 32, SHARED)
order = [("flat", False, False), ("flat_trim", False, True), ("cascade", True, False), ("cascade_trim", True, True)]
order += [(f"{n}_2", c, t) for n, c, t in reversed(order)]
tokens = {}
for name, cascade, trim in order:
    r = arm(cascade, trim)
    tokens[name] = r.pop("tokens")
    report[name] = r
    print(name, json.dumps({k: r[k] for k in ("decode_tokens_per_s", "median_step_ms", "median_host_ms",
                                              "median_device_ms", "trims", "memory")}), flush=True)
    (out / "probe.json").write_text(json.dumps(report, indent=1))
report["tokens_identical"] = {n: tokens[n] == tokens["flat"] for n in tokens}
(out / "probe.json").write_text(json.dumps(report, indent=1))
lines = ["| arm | tok/s | median step ms | host ms | device ms | trims | tokens = flat's |", "|---|---|---|---|---|---|---|"]
for name, *_ in order:
    r = report[name]
    lines.append(f"| {name} | {r['decode_tokens_per_s']:.0f} | {r['median_step_ms']:.2f} | {r['median_host_ms']:.2f} "
                 f"| {r['median_device_ms']:.2f} | {r['trims']} | {report['tokens_identical'][name]} |")
(out / "probe.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
