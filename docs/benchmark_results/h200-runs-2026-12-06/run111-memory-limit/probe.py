"""Whether MLX's memory limit sets the peak of run 110's cell (issue 18's, 32 x 8K, rows joining one a step with
their 32-token chunks, a 5,000-page bf16 pool, cascade on). MLX's eval waits for running work once its active
memory passes the limit (95% of the card by default), and buffers a queued graph holds are active until it runs:
with the pool and weights at 37.5 GB, in-flight prefill temporaries can fill the rest. Reads in one process, A B B
A: MLX's default limit, then a 50 GB limit; each read's peak, chunk steps and decode steps, and whether its tokens
are the first read's. python probe.py OUT"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import mlx.core as mx

import gpu_e2e_bench as e2e

POOL_PAGES = 5000
LOWER_LIMIT = 50 * 10**9


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    layers = e2e.QWEN3_8B["num_layers"]
    e2e.widen_graph_bound(layers, 32, POOL_PAGES)
    loaded = e2e.random_models(Path("/tmp/qwen3-8b-random"), layers)[1]
    batch = e2e.prompts(32, 8192, 32, vocab=loaded.vocab_size)
    args = argparse.Namespace(new_tokens=64, block_size=32, shared=8192)
    e2e.warm_up(loaded, batch, args.block_size, args.shared, kv_dtypes=("bfloat16",), new_tokens=16,
                pool_pages=POOL_PAGES)
    default = mx.get_memory_limit()
    reads, first = [], None
    for limit in (default, LOWER_LIMIT, LOWER_LIMIT, default):
        mx.set_memory_limit(limit)
        engine = e2e.make_engine(loaded, batch, args.new_tokens, True, args.block_size, args.shared, "bfloat16",
                                 POOL_PAGES)
        run = e2e.run_engine(engine, batch, args.new_tokens)
        steps = engine.snapshot.recent_steps
        e2e.release(engine)
        mixed = [1e3 * r.seconds for r in steps if r.prefill_tokens and r.batch > 1]
        decode = [1e3 * r.seconds for r in steps if r.kind == "decode" and not r.prefill_tokens and r.batch == 32]
        first = first or run["tokens"]
        reads.append({"memory_limit_gb": limit / 1e9, "peak_gb": run["peak_memory_gb"],
                      "mixed_steps": len(mixed), "mixed_ms_median": statistics.median(mixed),
                      "decode_ms_median": statistics.median(decode), "total_s": run["total_s"],
                      "same_tokens_as_first_read": run["tokens"] == first})
        print(json.dumps(reads[-1]), flush=True)
    (out / "probe.json").write_text(json.dumps(reads, indent=1))


if __name__ == "__main__":
    main()
