"""What tensor parallelism costs a decode step on this machine's CPU.

    python benchmarks/tp_overhead_cpu.py                        # one rank: the baseline step
    mlx.launch --backend ring -n 2 -- python benchmarks/tp_overhead_cpu.py

Prints one JSON line (rank 0): the bare collectives a decode step makes (the
step message, the decode tokens, two all_sums of [batch, hidden] per layer),
each timed alone as the median of many evaluated round trips, and the
engine's median decode step wall on a random-weight Qwen3 model
(BENCHMARK_QWEN3: 8 layers, hidden 1024), batch 8.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

BATCH, NEW_TOKENS, REPEATS = 8, 48, 200


def timed(fn, repeats: int = REPEATS) -> float:
    """Median seconds of one evaluated call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    from mlxcel.engine.config import CascadeConfig, EngineConfig
    from mlxcel.engine.engine import Engine
    from mlxcel.engine.model import load_model
    from mlxcel.engine.random_model import BENCHMARK_QWEN3, cached_random_model
    from mlxcel.engine.sequence import SamplingParams
    from mlxcel.engine.tensor_parallel import FIRST_WORDS, Ranks, launched
    from mlxcel_tui.workload import follow_as_rank

    home = Path(tempfile.gettempdir()) / "mlxcel-tp-bench"
    model_dir = cached_random_model("bench-qwen3", BENCHMARK_QWEN3, home)
    ranks = Ranks.join() if launched() else None
    out = {"ranks": ranks.size if ranks else 1}
    if ranks is not None:
        group = ranks.group
        message = mx.zeros((FIRST_WORDS,), mx.int32)
        hidden = mx.random.normal((BATCH, 1, BENCHMARK_QWEN3.hidden_size))
        tokens = mx.zeros((BATCH,), mx.int32)
        out["step_message_s"] = timed(lambda: mx.eval(mx.distributed.all_sum(message, group=group)))
        out["tokens_s"] = timed(lambda: mx.eval(mx.distributed.all_sum(tokens, group=group)))
        out["layer_all_sum_s"] = timed(lambda: mx.eval(mx.distributed.all_sum(hidden, group=group)))
        out["collectives_per_step"] = 2 * BENCHMARK_QWEN3.num_layers + 2
        if not ranks.is_leader:
            follow_as_rank(str(model_dir), "auto", ranks)
            return
    loaded = load_model(model_dir, group=ranks.group if ranks else None)
    engine = Engine(loaded, EngineConfig(num_blocks=512), cascade=CascadeConfig(enabled=False), ranks=ranks)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    for i in range(BATCH):
        engine.submit([(i * 31 + j) % 1000 + 3 for j in range(40)], params)
    engine.run_until_idle()
    decode = [r for r in engine.snapshot.recent_steps if r.kind == "decode" and r.batch == BATCH]
    out["decode_steps"] = len(decode)
    out["decode_step_p50_s"] = statistics.median(r.seconds for r in decode)
    engine.shutdown()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
