"""A causal prefill chunk's attention on the CPU: every query token over every key of the chunk's rows (main
before the change, each token's later keys masked) against query blocks of CPU_QUERY_BLOCK tokens each over the
keys up to its last token (engine/attention.py). The default model on an idle engine per read (no prefix cache
hits), a prompt's time to its first token and its first greedy tokens, the arms interleaved (A B B A a round).

    python prefill_ab.py [--tokens 1055,2048] [--rounds 2] [--new 8]
"""

import argparse
import json
import time

import numpy as np

from mlxcel.engine import allocator, attention, blas
from mlxcel.engine.config import EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.sequence import SamplingParams
from mlxcel_tui.workload import build_engine

TRIMMED = attention.dense_attention


def untrimmed(q, keys, values, mask, *, scale, last_key=None):
    """dense_attention as before the change: no causal bound, so every key of the gathered rows."""
    return TRIMMED(q, keys, values, mask, scale=scale)


def read(loaded, prompt: list[int], new: int, trimmed: bool) -> tuple[float, list[int]]:
    attention.dense_attention = TRIMMED if trimmed else untrimmed
    engine = Engine(loaded, EngineConfig())
    seq = engine.submit(prompt, SamplingParams(max_tokens=new, ignore_eos=True))
    start = time.perf_counter()
    while seq.num_completion_tokens == 0:
        engine.step()
    first = time.perf_counter() - start
    engine.run_until_idle()
    return first, list(seq.completion_token_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="1055,2048")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new", type=int, default=8)
    args = parser.parse_args()
    blas.reexec_with_openblas()   # the process tuning `mlxcel-tui serve` starts with
    allocator.keep_heap()
    loaded = build_engine("default", cascade=False, min_shared_pages=None, min_members=None).loaded
    rng = np.random.default_rng(0)
    report = {}
    for n in (int(t) for t in args.tokens.split(",")):
        prompt = rng.integers(3, loaded.vocab_size, n).tolist()
        read(loaded, prompt, 2, True)                       # warm-up: the shapes' first use
        times, tokens = {True: [], False: []}, {}
        for _ in range(args.rounds):
            for trimmed in (False, True, True, False):
                t, toks = read(loaded, prompt, args.new, trimmed)
                times[trimmed].append(t)
                tokens.setdefault(trimmed, toks)
                if toks != tokens[trimmed]:
                    raise SystemExit(f"{n} tokens: an arm's reads disagree")
        if tokens[True] != tokens[False]:
            raise SystemExit(f"{n} tokens: the arms' tokens differ: {tokens}")
        if len(set(tokens[True])) < 2:
            raise SystemExit(f"{n} tokens: greedy tokens do not vary: {tokens[True]}")
        row = {"tokens": tokens[True], "untrimmed_s": times[False], "trimmed_s": times[True],
               "ratio": float(np.median(times[False]) / np.median(times[True]))}
        report[n] = row
        print(json.dumps({n: row}), flush=True)
    print(f"\nmodel {loaded.name}, {blas.describe()}\n")
    print("| prompt tokens | first token s, untrimmed (median) | trimmed (median) | untrimmed / trimmed |")
    print("|---|---|---|---|")
    for n, r in report.items():
        print(f"| {n} | {np.median(r['untrimmed_s']):.2f} | {np.median(r['trimmed_s']):.2f} | {r['ratio']:.2f}x |")


if __name__ == "__main__":
    main()
