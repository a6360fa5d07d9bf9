"""Which weight dtype runs the default model fastest here: prefill seconds for a
512-token prompt and decode milliseconds per step (one sequence, mlx-lm's own
cache and attention), per dtype, each dtype in a fresh process, the dtypes
interleaved over --rounds so load drift hits them alike.

    python benchmarks/bench_weight_dtype.py [--dtypes float32,bfloat16,float16] [--rounds 2]

The process re-executes itself with OpenBLAS preloaded, as `mlxcel-tui` does.
Greedy tokens of every dtype are printed so they can be compared.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

PROMPT_TOKENS, DECODE_STEPS = 512, 32


def measure(dtype: str) -> dict:
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel.engine.builtin_models import builtin_model

    model, _ = mlx_lm.load(str(builtin_model("default", dtype)[0]))
    prompt = mx.array([list(range(1000, 1000 + PROMPT_TOKENS))])
    warm = make_prompt_cache(model)
    mx.eval(model(prompt[:, :32], cache=warm))  # first-call costs out of the timings
    cache = make_prompt_cache(model)
    start = time.perf_counter()
    logits = model(prompt, cache=cache)
    token = mx.argmax(logits[:, -1], axis=-1)
    mx.eval(token)
    prefill = time.perf_counter() - start
    tokens, steps = [token.item()], []
    for _ in range(DECODE_STEPS):
        start = time.perf_counter()
        token = mx.argmax(model(token[:, None], cache=cache)[:, -1], axis=-1)
        mx.eval(token)
        steps.append(time.perf_counter() - start)
        tokens.append(token.item())
    return {"dtype": dtype, "prefill_s": prefill, "decode_ms": sorted(steps)[len(steps) // 2] * 1e3,
            "tokens": tokens[:12]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process: measure this dtype
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one)))
        return
    from mlxcel.engine import blas

    print(f"BLAS: {blas.describe()}; prompt {PROMPT_TOKENS} tokens, decode median of {DECODE_STEPS} steps",
          flush=True)
    dtypes = args.dtypes.split(",")
    for round_ in range(args.rounds):
        for dtype in dtypes if round_ % 2 == 0 else dtypes[::-1]:
            out = subprocess.run([sys.executable, __file__, "--one", dtype], capture_output=True, text=True,
                                 check=True).stdout
            r = json.loads(out.splitlines()[-1])
            print(f"round {round_} {dtype:9s}: prefill {r['prefill_s']:6.2f} s, decode {r['decode_ms']:7.1f} ms/step, "
                  f"tokens {r['tokens']}", flush=True)


if __name__ == "__main__":
    from mlxcel.engine import blas

    blas.reexec_with_openblas()
    main()
