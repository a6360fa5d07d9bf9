"""What a new whole-layer trace costs a serving step, per-layer traces (main at 64814b8) against traces shared by
the layers alike (this change), one process, A B B A after a warm-up: each arm starts with no traces and serves
32 sessions behind an 8,192-token prefix, 48 tokens (the rows join one a step: each batch size a new signature),
then 24 of them, 16 tokens. Per read: every step's wall, the read's total, the steps over 0.2 s, the median
full-batch step, the tokens (equal across arms). usage: probe.py OUT_DIR"""
import json
import os
import sys
import time
from pathlib import Path

import gpu_e2e_bench as bench
from mlxcel.engine import layer_halves
from mlxcel.engine.layer_halves import LayerHalves, shared_traces

sys.path.insert(0, str(Path(__file__).parent))
from per_layer_halves import LayerHalves as PerLayerHalves  # noqa: E402

out = Path(sys.argv[1])
SHARED = int(os.environ.get("PROBE_SHARED", 8192))
stock, loaded = bench.random_models(Path("/tmp/qwen3-8b-random"), int(os.environ.get("PROBE_LAYERS", 36)))
batch = bench.prompts(32, SHARED, 32)
layers = loaded.model.layers
made = []       # one entry per whole-layer trace made (its Python run)
shared_whole, per_layer_whole = layer_halves.whole, PerLayerHalves.whole
layer_halves.whole = lambda *a: made.append(1) or shared_whole(*a)
PerLayerHalves.whole = lambda *a: made.append(1) or per_layer_whole(*a)


def fresh_traces(arm: str) -> None:
    traces = shared_traces(layers)
    for layer, shared in zip(layers, traces):
        layer.halves = LayerHalves(layer, shared) if arm == "shared" else PerLayerHalves(layer)


def read(rows: int, new: int) -> dict:
    engine = bench.make_engine(loaded, batch[:rows], new, True, 32, SHARED)
    seqs = [engine.submit(p, bench.SamplingParams(max_tokens=new, ignore_eos=True)) for p in batch[:rows]]
    steps, produced, traces_before = [], 0, len(made)
    while True:
        start = time.perf_counter()
        if not engine.step():
            break
        now = sum(s.num_completion_tokens for s in seqs)
        steps.append((time.perf_counter() - start, now - produced))
        produced = now
    bench.release(engine)
    slow = [round(t, 3) for t, _ in steps if t > 0.2]
    return {"rows": rows, "traces_made": len(made) - traces_before, "slow_steps_s": slow, "slow_total_s": round(sum(slow), 3),
            "read_s": round(sum(t for t, _ in steps), 3), "step_ms": [round(1e3 * t, 2) for t, _ in steps],
            **{k: v for k, v in bench.throughput(steps, rows).items() if k in ("median_step_ms", "full_decode_steps")},
            "tokens": [s.completion_token_ids for s in seqs]}


fresh_traces("shared")
bench.warm_up(loaded, batch, 32, SHARED, new_tokens=48)   # kernels built, plans' caches filled, for both arms
report = {"arms": []}
for arm in ("shared", "per_layer", "per_layer", "shared"):
    fresh_traces(arm)
    reads = [read(32, 48), read(24, 16)]
    report["arms"].append({"arm": arm, "reads": [{k: v for k, v in r.items() if k != "tokens"} for r in reads]})
    report.setdefault("tokens", [r["tokens"] for r in reads])
    report["arms"][-1]["tokens_equal_first_arm"] = [r["tokens"] for r in reads] == report["tokens"]
    print(json.dumps(report["arms"][-1]), flush=True)
    (out / "probe.json").write_text(json.dumps({k: v for k, v in report.items() if k != "tokens"}, indent=1))
rows = report["tokens"][0]
report["tokens_vary"] = sum(len(set(row)) > 1 for row in rows)
print("tokens vary on", report["tokens_vary"], "of", len(rows), "rows", flush=True)
(out / "probe.json").write_text(json.dumps({k: v for k, v in report.items() if k != "tokens"}, indent=1))
