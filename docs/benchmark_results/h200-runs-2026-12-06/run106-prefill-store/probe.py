"""Steps with a prefill chunk beside decode rows, at a server-sized pool (5,000 pages, 23.6 GB in bf16): each
such step's wall, the decode-only steps' wall, MLX's peak memory, the tokens. Issue 18's cell (32 x 8K, rows
joining one a step, each joining step carrying its 32-token chunk), cascade on, bf16 and int8 pages, one read
each after a warm-up. Run once with main's engine and once with the tree's; the tokens go to OUT/tokens.json
for the comparison. python probe.py OUT"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import mlx.core as mx

import gpu_e2e_bench as e2e

POOL_PAGES = 5000


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    layers = e2e.QWEN3_8B["num_layers"]
    e2e.widen_graph_bound(layers, 32, POOL_PAGES)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), layers)[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=64, block_size=32, shared=8192)
    e2e.warm_up(loaded, batch, args.block_size, args.shared, kv_dtypes=("bfloat16", "int8"), new_tokens=16,
                pool_pages=POOL_PAGES)
    reads, tokens = [], {}
    for kv in ("bfloat16", "int8", "int8", "bfloat16"):
        engine = e2e.make_engine(loaded, batch, args.new_tokens, True, args.block_size, args.shared, kv, POOL_PAGES)
        run = e2e.run_engine(engine, batch, args.new_tokens)
        steps = engine.snapshot.recent_steps
        e2e.release(engine)
        mixed_records = [r for r in steps if r.prefill_tokens and r.batch > 1]
        mixed = [1e3 * r.seconds for r in mixed_records]
        decode = [1e3 * r.seconds for r in steps if r.kind == "decode" and not r.prefill_tokens and r.batch == 32]
        tokens.setdefault(kv, run["tokens"])
        reads.append({"kv": kv, "mixed_steps": len(mixed), "mixed_ms_median": statistics.median(mixed),
                      "mixed_ms_mean": statistics.mean(mixed),
                      "mixed_host_ms_median": 1e3 * statistics.median(r.host_seconds for r in mixed_records),
                      "mixed_device_ms_median": 1e3 * statistics.median(r.device_seconds for r in mixed_records),
                      "decode_ms_median": statistics.median(decode),
                      "peak_gb": run["peak_memory_gb"], "total_s": run["total_s"],
                      "same_tokens_as_first_read": run["tokens"] == tokens[kv]})
        print(json.dumps(reads[-1]), flush=True)
    (out / "probe.json").write_text(json.dumps(reads, indent=1))
    (out / "tokens.json").write_text(json.dumps(tokens))


if __name__ == "__main__":
    main()
