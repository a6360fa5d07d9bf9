"""A long prompt arriving while streams decode: the streams' inter-token latency and the prompt's TTFT.

    python benchmarks/bench_long_prompt.py [--model tiny] [--streams 8] [--prompt-tokens 8192] \
        [--budgets 512,128,64]

Per token budget (``max_batched_tokens``), on one engine each: ``streams``
greedy streams decode alone (their p99 inter-token latency, the baseline),
then the long prompt arrives while they run (their p99 inter-token latency
while it prefills, and its time to first token), then the prompt alone on an
idle engine (its TTFT baseline). Inter-token latency is the time between a
stream's consecutive tokens as the engine streams them. The targets (issue
22): p99 ITL during the prefill <= 3x without it, TTFT <= 1.5x alone.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.sequence import SamplingParams
from mlxcel.engine import allocator, blas
from mlxcel_tui.workload import build_engine


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


class Streams:
    """Token arrival times of the running streams."""

    def __init__(self) -> None:
        self.times: dict[int, list[float]] = {}

    def on_event(self, seq, token, reason) -> None:
        if token is not None:
            self.times.setdefault(seq.id, []).append(time.perf_counter())

    def gaps(self, start: float, end: float) -> list[float]:
        """Inter-token gaps of tokens that arrived in [start, end]."""
        out = []
        for times in self.times.values():
            out += [b - a for a, b in zip(times, times[1:]) if start <= b <= end]
        return out


def run_budget(loaded, args, budget: int, rng) -> dict:
    engine = Engine(loaded, EngineConfig(num_blocks=args.kv_blocks, max_batched_tokens=budget,
                                         max_running=args.streams + 1), cascade=CascadeConfig(False))
    streams, params = Streams(), SamplingParams(max_tokens=2000, ignore_eos=True)
    running = [engine.submit(rng.integers(3, loaded.vocab_size, 64).tolist(), params, streams.on_event)
               for _ in range(args.streams)]
    while not all(s.num_completion_tokens for s in running):
        engine.step()
    begin = time.perf_counter()
    for _ in range(args.baseline_steps):
        engine.step()
    alone_end = time.perf_counter()
    prompt = rng.integers(3, loaded.vocab_size, args.prompt_tokens).tolist()
    arrived = time.perf_counter()
    late = engine.submit(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    while late.num_completion_tokens == 0:
        engine.step()
    first = time.perf_counter()
    for seq in running:
        engine.cancel(seq)
    engine.run_until_idle()

    idle = Engine(loaded, EngineConfig(num_blocks=args.kv_blocks, max_batched_tokens=budget,
                                       max_running=args.streams + 1), cascade=CascadeConfig(False))
    start = time.perf_counter()
    idle.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))
    alone_ttft = time.perf_counter() - start
    result = {"budget": budget, "itl_p99_alone_s": p99(streams.gaps(begin, alone_end)),
              "itl_p99_during_prefill_s": p99(streams.gaps(arrived, first)),
              "ttft_s": first - arrived, "ttft_alone_s": alone_ttft}
    result["itl_ratio"] = result["itl_p99_during_prefill_s"] / result["itl_p99_alone_s"]
    result["ttft_ratio"] = result["ttft_s"] / alone_ttft
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=8192)
    parser.add_argument("--budgets", default="512,128,64")
    parser.add_argument("--baseline-steps", type=int, default=30)
    parser.add_argument("--kv-blocks", type=int, default=1024)
    args = parser.parse_args()
    blas.reexec_with_openblas()   # the process tuning `mlxcel-tui serve` starts with
    allocator.keep_heap()
    loaded = build_engine(args.model, cascade=False, min_shared_pages=None, min_members=None).loaded
    rng = np.random.default_rng(0)
    rows = []
    for budget in (int(b) for b in args.budgets.split(",")):
        rows.append(run_budget(loaded, args, budget, rng))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.streams} streams, a {args.prompt_tokens}-token prompt arriving, model {loaded.name}\n")
    print("| budget | p99 ITL alone ms | p99 ITL during prefill ms | ratio (<= 3) | TTFT s | alone s "
          "| ratio (<= 1.5) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['budget']} | {1e3 * r['itl_p99_alone_s']:.1f} | {1e3 * r['itl_p99_during_prefill_s']:.1f} "
              f"| {r['itl_ratio']:.2f} | {r['ttft_s']:.2f} | {r['ttft_alone_s']:.2f} | {r['ttft_ratio']:.2f} |")


if __name__ == "__main__":
    main()
