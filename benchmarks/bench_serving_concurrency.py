"""End-to-end serving benchmark: N clients behind one shared system prompt,
each streaming one chat completion of exactly --max-tokens tokens, per
concurrency level, reported in the layout of `vllm bench serve`.

Against a running server (one arm, "server"):

    python benchmarks/bench_serving_concurrency.py --url http://127.0.0.1:8000 --metrics \\
        --shared-prefix-tokens 2048 --prompt-tokens 32 --concurrency 4,8,16,32 --max-tokens 128

Without --url it starts `mlxcel-tui serve --headless --sessions 0` itself, once
per arm (--arms on,off: cascade on and cascade off, same build), and stops them
at the end; --compare-mlx-lm MODEL adds mlx-lm's BatchGenerator in process:

    python benchmarks/bench_serving_concurrency.py --model benchmark-qwen3 \\
        --concurrency 4,8,16 --max-tokens 128 --reps 3 --compare-mlx-lm benchmark-qwen3

--kv-dtype float32,int8 runs every arm once per KV page format (arms
"cascade-off+float32", "cascade-off+int8", ...) and prints the KV memory and
decode ratios of each format against the first; quantized pages change the
numbers attention sees, so their token agreement is reported, not required:

    python benchmarks/bench_serving_concurrency.py --model default --arms off --kv-dtype float32,int8 \
        --shared-prefix-tokens 512 --concurrency 8 --max-tokens 64 --reps 2

Every (level, rep) sends a system prompt never seen before (the first client
pays its prefill, the others may reuse it); arms run the same requests,
interleaved rep by rep, and their greedy outputs are compared before any
ratio is printed. A warm-up (two clients, a prompt of its own, the full shared
prefix) runs untimed first on every arm. On Linux the process re-executes itself with OpenBLAS
preloaded, like `mlxcel-tui` does, so the mlx-lm arm and the servers it starts
all use the same BLAS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_bench.agreement import compare_arms  # noqa: E402
from serving_bench.arm_run import ArmRun  # noqa: E402
from serving_bench.http_arm import HttpArm  # noqa: E402
from serving_bench.level_result import LevelResult  # noqa: E402
from serving_bench.models import DEFAULT, resolve_model, server_model_argument  # noqa: E402
from serving_bench.report import (CASCADE_OFF, CASCADE_ON, CASCADE_ONE, SERVER, arm_name,  # noqa: E402
                                  ratio_lines, result_block, split_arm, summary_table)
from serving_bench.server_process import ManagedServer  # noqa: E402
from serving_bench.workload import WARMUP_VARIANT, build_workload, level_variant  # noqa: E402

# arm -> (name, server flags, server environment); "one" plans the seed's one
# subgroup and one level (decode_plan.SPANS_ENV), "on" every span.
ARM_FLAGS = {"on": (CASCADE_ON, ["--cascade"], {}), "off": (CASCADE_OFF, ["--no-cascade"], {}),
             "one": (CASCADE_ONE, ["--cascade"], {"MLXCEL_CASCADE_SPANS": "one"})}
WARMUP_CONCURRENCY = 2
WARMUP_MAX_TOKENS = 16
# Prompt tokens the chat template adds around the system prompt and the question.
TEMPLATE_TOKENS = 16


def int_list(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def arm_list(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARM_FLAGS]
    if not arms or unknown:
        raise argparse.ArgumentTypeError(f"arms are a comma list of {sorted(ARM_FLAGS)}, got {text!r}")
    return arms


def kv_dtype_list(text: str) -> list[str]:
    from mlxcel.engine.pool import KV_DTYPES

    names = list(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    unknown = [a for a in names if a not in KV_DTYPES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"KV dtypes are a comma list of {list(KV_DTYPES)}, got {text!r}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server; without it, servers are started per --arms")
    parser.add_argument("--model", default=DEFAULT,
                        help="model directory, 'default' (SmolLM2-135M-Instruct), 'tiny' (random test model) or "
                             "'benchmark-qwen3'; "
                             "the prompts' tokenizer, and what started servers serve [default]")
    parser.add_argument("--arms", type=arm_list, default=["on", "off"],
                        help="servers to start: on (cascade, every span), one (cascade, one subgroup and one "
                             "level), off (no cascade) [on,off]")
    parser.add_argument("--kv-dtype", type=kv_dtype_list, default=None,
                        help="started servers' KV page formats (serve --kv-dtype), a comma list: every arm runs "
                             "on each, the first the reference of the others' ratios [the model's dtype]")
    parser.add_argument("--shared-prefix-tokens", type=int, default=2048,
                        help="tokens of the system prompt every client sends [2048]")
    parser.add_argument("--tenants", type=int, default=1,
                        help="system prompts the clients are split over (client i sends tenant i mod K's) [1]")
    parser.add_argument("--sub-prefix-tokens", type=int, default=None,
                        help="each tenant's own sub-prefix after the common system prompt, in tokens [none]")
    parser.add_argument("--prompt-tokens", type=int, default=32,
                        help="tokens of each client's own question [32]")
    parser.add_argument("--concurrency", type=int_list, default=[4, 8, 16, 32],
                        help="levels: clients sending at once [4,8,16,32]")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens every request generates [128]")
    parser.add_argument("--reps", type=int, default=1, help="timed runs per level; figures are medians [1]")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the untimed warm-up level")
    parser.add_argument("--metrics", action="store_true",
                        help="scrape /metrics around each level: launch-path split, decode time, memory "
                             "(always on for started servers)")
    parser.add_argument("--compare-mlx-lm", metavar="MODEL",
                        help="also run mlx-lm's BatchGenerator in process on MODEL (same names as --model)")
    parser.add_argument("--kv-blocks", type=int, default=None,
                        help="KV pool blocks of started servers [enough for the largest level, twice over]")
    parser.add_argument("--block-size", type=int, default=32, help="KV page size of started servers [32]")
    parser.add_argument("--min-shared-pages", type=int, default=None,
                        help="cascade threshold of the started cascade-on server [server default, 16]")
    parser.add_argument("--poll-interval", type=float, default=0.25,
                        help="seconds between /metrics polls for the pool's live blocks [0.25]")
    parser.add_argument("--log-dir", type=Path, default=None, help="where started servers log [a temp dir]")
    parser.add_argument("--json", type=Path, default=None, help="write every run's figures and requests here")
    args = parser.parse_args(argv)
    for name in ("shared_prefix_tokens", "prompt_tokens", "max_tokens", "reps", "block_size", "tenants"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    args.concurrency = sorted(set(args.concurrency))
    if args.url is None:
        args.metrics = True
    elif args.kv_dtype:
        parser.error("--kv-dtype picks the formats of the servers this benchmark starts: not with --url")
    return args


def server_arms(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(arm, KV dtype or None) of each server to start: every arm on each --kv-dtype."""
    return [(arm, kv_dtype) for arm in args.arms for kv_dtype in (args.kv_dtype or [None])]


def pool_blocks(args: argparse.Namespace) -> int:
    """Twice the pages the largest level needs when its clients share the prefix:
    the shared pages once, each client's question and completion privately."""
    shared = -(-(args.shared_prefix_tokens + TEMPLATE_TOKENS) // args.block_size) * args.tenants
    shared += args.tenants * -(-(args.sub_prefix_tokens or 0) // args.block_size)
    private = -(-(args.prompt_tokens + TEMPLATE_TOKENS + args.max_tokens) // args.block_size) + 1
    return 2 * (shared + max(args.concurrency) * private)


def server_args(args: argparse.Namespace, arm: str, kv_dtype: str | None = None) -> list[str]:
    flags = list(ARM_FLAGS[arm][1])
    if arm in ("on", "one") and args.min_shared_pages is not None:
        flags += ["--min-shared-pages", str(args.min_shared_pages)]
    if kv_dtype is not None:
        flags += ["--kv-dtype", kv_dtype]
    return flags + ["--kv-blocks", str(args.kv_blocks or pool_blocks(args)), "--block-size", str(args.block_size)]


def header(args: argparse.Namespace) -> str:
    import mlx.core as mx

    from mlxcel.engine import blas

    load = os.getloadavg()
    return "\n".join([
        "$ " + shlex.join([sys.executable, *sys.argv]),
        f"host: {platform.machine()} {platform.system()}, {os.cpu_count()} cores; MLX {mx.__version__} "
        f"on {mx.default_device()}; BLAS: {blas.describe()}",
        f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        f"shared prefix {args.shared_prefix_tokens} tokens, {args.tenants} tenant(s), sub-prefix "
        f"{args.sub_prefix_tokens or 0} tokens, question {args.prompt_tokens} tokens, "
        f"max tokens {args.max_tokens}, concurrency {','.join(map(str, args.concurrency))}, reps {args.reps}"
        + (f", KV dtypes {','.join(args.kv_dtype)}" if args.kv_dtype else ""),
    ])


def run_line(run: ArmRun) -> str:
    s = run.summary
    text = (f"  {run.arm:<12} rep {run.rep}: {s.duration_s:7.2f} s, out {s.output_throughput:7.1f} tok/s, "
            f"decode {run.decode_throughput:7.1f} tok/s, TTFT 1st {s.ttft_first_ms:8.0f} ms, "
            f"2..N {s.ttft_rest_mean_ms:8.0f} ms, TPOT {s.tpot_mean_ms:6.1f} ms")
    failed = [r for r in run.records if not r.ok]
    if failed:
        text += f"\n    {len(failed)} request(s) failed; first: {failed[0].error}"
    if run.launches is not None:
        text += "\n" + "\n".join("    " + part for part in run.launches.describe().splitlines())
    return text


def start_arms(args: argparse.Namespace, model_path: Path, stack: contextlib.ExitStack, log_dir: Path) -> list:
    arms = []
    if args.url:
        arms.append(HttpArm(SERVER, args.url, scrape_metrics=args.metrics, poll_interval=args.poll_interval))
    else:
        model_argument = server_model_argument(args.model, model_path)
        servers = []
        for arm, kv_dtype in server_arms(args):  # all launched, then each awaited: they load in parallel
            name = arm_name(ARM_FLAGS[arm][0], kv_dtype)
            servers.append(stack.enter_context(ManagedServer(name, model_argument, server_args(args, arm, kv_dtype),
                                                             log_dir / f"{name}.log", env=ARM_FLAGS[arm][2])))
        for server in servers:
            server.wait_ready()
            print(f"started {server.name}: {shlex.join(server.command)} -> {server.url} (log {server.log_path})",
                  flush=True)
            arms.append(HttpArm(server.name, server.url, scrape_metrics=True, poll_interval=args.poll_interval))
    if args.compare_mlx_lm:
        from serving_bench.mlx_lm_arm import MlxLmArm

        arms.append(MlxLmArm(resolve_model(args.compare_mlx_lm)))
    return arms


def warm_up(arms: list, tokenizer, args: argparse.Namespace) -> None:
    workload = build_workload(tokenizer, shared_prefix_tokens=args.shared_prefix_tokens,
                              prompt_tokens=args.prompt_tokens,
                              concurrency=min(WARMUP_CONCURRENCY, args.concurrency[0]),
                              max_tokens=min(args.max_tokens, WARMUP_MAX_TOKENS), variant=WARMUP_VARIANT,
                              tenants=args.tenants, sub_prefix_tokens=args.sub_prefix_tokens)
    for arm in arms:
        started = time.perf_counter()
        arm.run(workload, rep=-1)
        print(f"warm-up {arm.name}: {time.perf_counter() - started:.1f} s", flush=True)


def run_level(arms: list, tokenizer, args: argparse.Namespace, level_index: int, concurrency: int) -> LevelResult:
    level = LevelResult(concurrency)
    workloads = [build_workload(tokenizer, shared_prefix_tokens=args.shared_prefix_tokens,
                                prompt_tokens=args.prompt_tokens, concurrency=concurrency, max_tokens=args.max_tokens,
                                variant=level_variant(level_index, rep, args.reps), tenants=args.tenants,
                                sub_prefix_tokens=args.sub_prefix_tokens) for rep in range(args.reps)]
    print(f"\n### concurrency {concurrency}: prompts share their first {workloads[0].shared_tokens} tokens "
          f"(load average {os.getloadavg()[0]:.2f})", flush=True)
    for rep, workload in enumerate(workloads):
        order = arms if rep % 2 == 0 else arms[::-1]  # alternate, so drift and order effects hit all arms
        for arm in order:
            run = arm.run(workload, rep)
            level.add(run)
            print(run_line(run), flush=True)
    for arm in level.arms:
        print(result_block(f"{arm} @ concurrency {concurrency}", level.figures(arm)))
    for agreement in compare_arms(level):
        # Another KV format changes the numbers attention sees: a difference is measured there, not a fault.
        same_numerics = split_arm(agreement.arm)[1] == split_arm(agreement.reference)[1]
        flag = "" if agreement.all_identical else "WARNING: outputs differ: " if same_numerics else \
            "outputs differ (another KV format): "
        print(flag + agreement.describe())
    return level


def write_json(path: Path, args: argparse.Namespace, levels: list[LevelResult]) -> None:
    def encode(run: ArmRun) -> dict:
        out = asdict(run)
        out["summary"] = asdict(run.summary)
        out["decode_throughput"] = run.decode_throughput
        return out

    document = {"command": [sys.executable, *sys.argv], "args": {k: str(v) for k, v in vars(args).items()},
                "levels": [{"concurrency": lv.concurrency, "runs": [encode(r) for runs in lv.runs.values()
                                                                    for r in runs]} for lv in levels]}
    path.write_text(json.dumps(document, indent=1, default=str))


def main(argv: list[str] | None = None) -> list[LevelResult]:
    args = parse_args(argv)
    from mlx_lm.utils import load_tokenizer

    print(header(args), flush=True)
    model_path = resolve_model(args.model)
    tokenizer = load_tokenizer(model_path)
    levels = []
    with contextlib.ExitStack() as stack:
        log_dir = args.log_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-serving-")))
        log_dir.mkdir(parents=True, exist_ok=True)
        arms = start_arms(args, model_path, stack, log_dir)
        if args.warmup:
            warm_up(arms, tokenizer, args)
        for level_index, concurrency in enumerate(args.concurrency):
            levels.append(run_level(arms, tokenizer, args, level_index, concurrency))
    print("\n## Summary (medians over reps; times in ms)\n")
    print(summary_table(levels))
    print()
    for text in ratio_lines(levels):
        print(text)
    for level in levels:
        for agreement in compare_arms(level):
            print(f"concurrency {level.concurrency}: greedy outputs {agreement.describe()}")
    if args.json:
        write_json(args.json, args, levels)
    return levels


if __name__ == "__main__":
    from mlxcel.engine import blas

    blas.reexec_with_openblas()
    main()
