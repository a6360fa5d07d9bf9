"""End-to-end decode throughput on the GPU: the engine with cascade on and off,
and mlx-lm's BatchGenerator, on a random-weight Qwen3-8B-shaped model.

    python benchmarks/gpu_e2e_bench.py --out OUTDIR

The model (36 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 12288,
bf16, the embedded 1024-token vocabulary) is mlx-lm's own Qwen3 class with
its random initialization, built in memory on the machine (writing its 16 GB
to disk first cost minutes of device time); the config and tokenizer files
come from ``generate_random_model``. The engine runs a second instance that
shares every weight it does not fuse (``on_pool``); mlx-lm's arm and the
teacher-forced scores use the stock one. ``concurrency`` prompts share a
``shared``-token prefix and differ in a short suffix; every request
generates ``new_tokens`` greedy tokens (EOS ignored). The engine arms run
twice, in the order cascade, flat, flat, cascade, so drift shows; with
``--kv-dtypes bfloat16,int8`` every KV page format gets both arms (ABBA over
all of them), and ``--fit-private N`` counts the sessions of N own tokens
each format's pool holds in the memory the weights leave; with
``--cascade-matmuls auto,cublas`` the cascade arms run with each matmul choice
(MLXCEL_MATMUL) in the same ABBA order.

Decode throughput counts full-batch decode steps only: steps in which every
one of the ``concurrency`` requests got a token (both schedulers interleave
the last prefills with the first decodes, and requests finish one by one at
the end). Tokens/s = their tokens / their wall time; each step ends with the
sampled tokens on the host, so wall time is device time plus the engine's
host work. The arms' tokens are compared: identical work, greedy decoding;
a bf16 rounding difference between two attention groupings (or two prefill
schedules) can flip a near-tie argmax, after which the sequences part. So
besides counting agreeing steps, each arm's tokens for a few rows (0, 1, the
last, and the first rows on which two arms part) are scored by mlx-lm's own
forward pass, teacher-forced on that arm's sequence: at every
step, how far the chosen token's logit sits below mlx-lm's top logit, and its
rank. A correct engine picks mlx-lm's argmax or a near-tie (gap around the
bf16 noise, far below the logits' spread); a harness bug picks tokens at
random ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlx_lm.utils import _get_classes, load_config, load_tokenizer

from mlxcel.engine import graph_bound
from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.model import LoadedModel, on_pool
from mlxcel.engine.pool import PoolGeometry
from mlxcel.engine.sequence import SamplingParams
from mlxcel.engine.random_model import VOCAB_SIZE, generate_random_model
from mlxcel.kernels.layer_ops import MATMUL_ENV

# MLX's CUDA graph sizes (its defaults on an H200: 100 kernels or 1000 MB of inputs a graph); recorded with
# each run, as larger graphs measured slower end to end.
MLX_GRAPH_LIMITS = ("MLX_MAX_OPS_PER_BUFFER", "MLX_MAX_MB_PER_BUFFER")
QWEN3_8B = dict(model_type="qwen3", num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                intermediate_size=12288)
FIRST_ORDINARY_TOKEN = 3      # ids 0..2 are the embedded tokenizer's special tokens


def prompts(concurrency: int, shared: int, suffix: int, seed: int = 0, vocab: int = VOCAB_SIZE) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    prefix = rng.integers(FIRST_ORDINARY_TOKEN, vocab, shared).tolist()
    return [prefix + rng.integers(FIRST_ORDINARY_TOKEN, vocab, suffix).tolist() for _ in range(concurrency)]


def random_models(model_dir: Path, layers: int) -> tuple[nn.Module, LoadedModel]:
    """mlx-lm's stock model and the engine's, random bf16 weights built in memory."""
    generate_random_model(model_dir, **{**QWEN3_8B, "num_layers": 1}, seed=0, dtype="bfloat16")  # config, tokenizer
    config = load_config(model_dir)
    config["num_hidden_layers"] = layers
    model_class, args_class = _get_classes(config)
    stock = model_class(args_class.from_dict(config))
    stock.set_dtype(mx.bfloat16)
    mx.eval(stock.parameters())
    ours = model_class(args_class.from_dict(config))
    ours.update(stock.parameters())               # the same arrays: on_pool replaces only what it fuses
    return stock, on_pool(ours, load_tokenizer(model_dir), "qwen3-8b-random", model_dir, "qwen3")


def engine_pages(batch: list[list[int]], new_tokens: int, block_size: int, shared: int, pool_pages: int = 0) -> int:
    """The engine arms' pool: the shared prefix once (the prefix cache adopts it) plus every request's own
    pages; sizing it for unshared prompts would take ~40 GB per engine at 32 x 8K on this model and starve
    the mlx-lm arm. ``pool_pages``: a larger pool, as a server sizes one to its memory."""
    own = max(len(p) - shared for p in batch) + new_tokens
    return max(shared // block_size + len(batch) * (-(-own // block_size) + 1) + 64, pool_pages)


def widen_graph_bound(layers: int, block_size: int, pages: int) -> None:
    """MLX's graph byte bound as the serve command sets it (graph_bound) for a pool of ``pages`` on the random
    model (bf16's pages, the largest); before anything runs on the GPU."""
    geometry = PoolGeometry.named(layers, QWEN3_8B["num_kv_heads"], QWEN3_8B["head_dim"], block_size, "bfloat16")
    graph_bound.widen_for_pool(geometry, pages)


def make_engine(loaded: LoadedModel, batch: list[list[int]], new_tokens: int, cascade: bool, block_size: int,
                shared: int, kv_dtype: str | None = None, pool_pages: int = 0) -> Engine:
    pages = engine_pages(batch, new_tokens, block_size, shared, pool_pages)
    return Engine(loaded, EngineConfig(block_size=block_size, num_blocks=pages, max_running=len(batch),
                                       max_batched_tokens=2048, kv_dtype=kv_dtype),
                  cascade=CascadeConfig(enabled=cascade, min_shared_pages=16, min_members=2))


def run_engine(engine: Engine, batch: list[list[int]], new_tokens: int, each_step=None) -> dict:
    """Serve the batch; per engine step (seconds, tokens it delivered). ``each_step(engine, index)``
    runs before every step (the step profile opens its window there)."""
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    mx.reset_peak_memory()
    start = time.perf_counter()
    seqs = [engine.submit(p, params) for p in batch]
    steps = []
    produced = 0
    while True:
        if each_step is not None:
            each_step(engine, len(steps))
        begin = time.perf_counter()
        if not engine.step():
            break
        now = sum(s.num_completion_tokens for s in seqs)
        steps.append((time.perf_counter() - begin, now - produced))
        produced = now
    total = time.perf_counter() - start
    registry = engine.metrics.registry
    launches = {path: registry.get_sample_value("mlxcel_paged_decode_launches_total", {"path": path})
                for path in ("fused_v2", "cascade", "gather")}
    records = [r for r in engine.snapshot.recent_steps if r.kind == "decode" and r.batch == len(batch)]
    return {**throughput(steps, len(batch)), "total_s": total, "peak_memory_gb": mx.get_peak_memory() / 1e9,
            "launches_per_layer_path": launches,
            "median_host_ms": 1e3 * statistics.median(r.host_seconds for r in records) if records else None,
            "median_device_ms": 1e3 * statistics.median(r.device_seconds for r in records) if records else None,
            "tokens": [s.completion_token_ids for s in seqs]}


def engine_arm(loaded, batch: list[list[int]], new_tokens: int, cascade: bool, block_size: int,
               shared: int, kv_dtype: str | None = None, matmul: str = "auto", pool_pages: int = 0) -> dict:
    """One read; ``matmul`` the engine's MLXCEL_MATMUL for it."""
    with matmul_env(matmul):
        engine = make_engine(loaded, batch, new_tokens, cascade, block_size, shared, kv_dtype, pool_pages)
        result = run_engine(engine, batch, new_tokens)
        release(engine)
    return result


@contextlib.contextmanager
def matmul_env(matmul: str):
    """MLXCEL_MATMUL set to ``matmul`` (``auto``: unset) inside, as it was after."""
    before = os.environ.pop(MATMUL_ENV, None)
    if matmul != "auto":
        os.environ[MATMUL_ENV] = matmul
    try:
        yield
    finally:
        os.environ.pop(MATMUL_ENV, None)
        if before is not None:
            os.environ[MATMUL_ENV] = before


def warm_up(loaded, batch: list[list[int]], block_size: int, shared: int,
            kv_dtypes: tuple[str | None, ...] = (None,), matmuls: tuple[str, ...] = ("auto",),
            new_tokens: int = 16, pool_pages: int = 0) -> None:
    """Each path once first, so that no measured read pays for compiling its kernels (NVRTC builds each
    template instance on its first launch: seconds at this shape) or tracing its layers. Rows join one a step,
    so a read of fewer tokens than the batch never runs a decode-only step of the whole batch, whose new kernel
    instances cost it 5-8 s at 32 x 32K on an H100 before an engine built its projection kernels when it
    started. The warm-up runs as many tokens as a read."""
    for kv_dtype in kv_dtypes:
        for cascade in (True, False):
            for matmul in matmuls if cascade else matmuls[:1]:
                engine_arm(loaded, batch, new_tokens, cascade, block_size, shared, kv_dtype, matmul, pool_pages)


def arm_order(kv_dtypes: list[str], matmuls: list[str] = ("auto",)) -> list[tuple[str, bool, str, str]]:
    """(name, cascade, kv dtype, matmul) of each measured read: cascade (once per matmul choice) and flat of
    every KV dtype, then the same reversed (ABBA), so drift over the run shows. The first KV dtype's and the
    first matmul's arms keep the plain names."""
    def name(arm: str, kv: str, matmul: str) -> str:
        return arm + ("" if matmul == matmuls[0] else "_" + matmul) + ("" if kv == kv_dtypes[0] else "_" + kv)

    first = [(name(arm, kv, matmul), arm == "cascade", kv, matmul) for kv in kv_dtypes
             for arm, choices in (("cascade", matmuls), ("flat", matmuls[:1])) for matmul in choices]
    return first + [(f"{n}_2", cascade, kv, matmul) for n, cascade, kv, matmul in reversed(first)]


def sessions_that_fit(loaded: LoadedModel, kv_dtype: str, private: int, new_tokens: int, block_size: int,
                      headroom: float) -> dict:
    """How many sessions of ``private`` own tokens (plus their new ones) the GPU's memory holds in a pool of
    this KV dtype: the pool allocated from the bytes left after the weights and ``headroom`` of the device
    (activations, MLX's buffers), then its pages divided by a session's."""
    mx.clear_cache()
    info = mx.device_info()
    total = info.get("total_memory") or info["memory_size"]     # CUDA's name, Metal's
    budget = int(total * (1 - headroom)) - mx.get_active_memory()

    def measure() -> dict:
        engine = Engine(loaded, EngineConfig(block_size=block_size, pool_bytes=budget, kv_dtype=kv_dtype))
        pool = engine.pool
        allocated = sum(layer.nbytes for layer in (*pool.keys, *pool.values))   # codes, scales, zeros
        per_session = -(-(private + new_tokens) // block_size)
        engine.stop()
        return {"pool_blocks": pool.num_blocks, "pool_gb": allocated / 1e9,
                "page_bytes": pool.geometry.bytes_per_block, "pages_per_session": per_session,
                "sessions": pool.num_blocks // per_session}

    result = measure()      # the engine and its pool are unreachable now: collected here
    gc.collect()
    mx.clear_cache()
    return result


def release(engine: Engine) -> None:
    """Free the engine's pool now (its metrics refer back to it: a cycle the
    garbage collector, not reference counting, breaks) and MLX's buffer cache."""
    engine.stop()
    del engine
    gc.collect()
    mx.clear_cache()


def throughput(steps: list[tuple[float, int]], concurrency: int) -> dict:
    full = [(t, n) for t, n in steps if n == concurrency]
    seconds, tokens = sum(t for t, _ in full), sum(n for _, n in full)
    return {"full_decode_steps": len(full), "decode_s": seconds, "decoded_tokens": tokens,
            "decode_tokens_per_s": tokens / seconds if seconds else 0.0,
            "median_step_ms": 1e3 * sorted(t for t, _ in full)[len(full) // 2] if full else float("nan")}


def mlx_lm_arm(model, batch: list[list[int]], new_tokens: int) -> dict:
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, max_tokens=new_tokens, completion_batch_size=len(batch),
                         prefill_batch_size=8, prefill_step_size=2048)
    mx.reset_peak_memory()
    start = time.perf_counter()
    uids = gen.insert(batch)
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    steps = []
    while any(len(t) < new_tokens for t in tokens.values()):
        begin = time.perf_counter()
        _, responses = gen.next()
        for r in responses:
            tokens[r.uid].append(r.token)
        steps.append((time.perf_counter() - begin, len(responses)))
    total = time.perf_counter() - start
    gen.close()
    return {**throughput(steps, len(batch)), "total_s": total, "peak_memory_gb": mx.get_peak_memory() / 1e9,
            "tokens": [tokens[u] for u in uids]}


PARTED_ROWS_SCORED = 4   # each scored row is a forward pass over its 8K prompt per arm


def teacher_forced(model, prompt: list[int], tokens: list[int], chunk: int = 2048) -> dict:
    """Score greedy ``tokens`` with mlx-lm's forward pass over prompt + tokens."""
    from mlx_lm.models.cache import make_prompt_cache

    ids, first = prompt + tokens[:-1], len(prompt) - 1      # logits at ids[first:] predict tokens
    cache = make_prompt_cache(model)
    parts = []
    for start in range(0, len(ids), chunk):
        logits = model(mx.array(ids[start:start + chunk])[None], cache=cache)[0]
        if start + logits.shape[0] > first:
            parts.append(logits[max(first - start, 0):].astype(mx.float32))
        mx.eval(parts, [c.state for c in cache])
    logits = np.array(mx.concatenate(parts))
    chosen = logits[np.arange(len(tokens)), tokens]
    top2 = np.sort(logits, axis=-1)[:, -2:]
    gap = top2[:, 1] - chosen
    return {"steps": len(tokens), "argmax_steps": int((gap == 0).sum()),
            "max_gap": float(gap.max()), "median_gap": float(np.median(gap)),
            "max_rank": int((logits > chosen[:, None]).sum(-1).max()),
            "median_top1_top2": float(np.median(top2[:, 1] - top2[:, 0])),
            "logit_std": float(logits.std(axis=-1).mean())}


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    parted = [row for row, (x, y) in enumerate(zip(a, b)) if x != y]
    prefix = min(next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
                 for x, y in zip(a, b))
    return {"identical_rows": len(a) - len(parted), "rows": len(a), "steps_all_rows_agree": prefix,
            "parted_rows": parted}


def scored_rows(report: dict, concurrency: int) -> list[int]:
    """The rows the teacher-forced check scores: a full prefill (row 0), prefix-cache hits (1, the last),
    and the first PARTED_ROWS_SCORED rows on which two arms' tokens part (a near-tie, or a bug)."""
    parted = sorted({row for key, value in report.items() if key.endswith("_tokens") for row in value["parted_rows"]})
    return sorted({0, 1, concurrency - 1, *parted[:PARTED_ROWS_SCORED]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/qwen3-8b-random"),
                        help="where the config and tokenizer files are written")
    parser.add_argument("--layers", type=int, default=QWEN3_8B["num_layers"])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--shared", type=int, default=8192)
    parser.add_argument("--suffix", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--skip-mlx-lm", action="store_true")
    parser.add_argument("--kv-dtypes", default="bfloat16",
                        help="comma-separated KV page formats to run the engine arms on (bfloat16, int8, int4)")
    parser.add_argument("--fit-private", type=int, default=0,
                        help="also count the sessions of this many own tokens each --fit-kv-dtypes pool holds")
    parser.add_argument("--fit-kv-dtypes", default="bfloat16,int8,int4")
    parser.add_argument("--pool-pages", type=int, default=0,
                        help="the engine arms' pool in pages (default: what the cell needs)")
    parser.add_argument("--cascade-matmuls", default="auto",
                        help="comma-separated MLXCEL_MATMUL choices to run the cascade arms with (auto, cublas, "
                             "no-tma)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "device": str(mx.default_device()),
                    "mlx_graph_limits": {k: os.environ.get(k) for k in MLX_GRAPH_LIMITS}}

    def save() -> None:
        (args.out / "e2e_bench.json").write_text(json.dumps(report, indent=1))

    batch = prompts(args.concurrency, args.shared, args.suffix)
    widen_graph_bound(args.layers, args.block_size,
                      engine_pages(batch, args.new_tokens, args.block_size, args.shared, args.pool_pages))
    report["mlx_graph_limits"] = {k: os.environ.get(k) for k in MLX_GRAPH_LIMITS}
    start = time.perf_counter()
    stock, loaded = random_models(args.model_dir, args.layers)
    report["model_build_s"] = time.perf_counter() - start
    print(json.dumps({"model_build_s": report["model_build_s"]}), flush=True)

    kv_dtypes = args.kv_dtypes.split(",")
    if args.fit_private:
        report["fit"] = {kv: sessions_that_fit(loaded, kv, args.fit_private, args.new_tokens, args.block_size, 0.1)
                         for kv in args.fit_kv_dtypes.split(",")}
        print("fit", json.dumps(report["fit"]), flush=True)
        save()
    matmuls = args.cascade_matmuls.split(",")
    warm_up(loaded, batch, args.block_size, args.shared, tuple(kv_dtypes), tuple(matmuls), args.new_tokens,
            args.pool_pages)
    arms = {}
    for key, cascade, kv_dtype, matmul in arm_order(kv_dtypes, matmuls):
        result = engine_arm(loaded, batch, args.new_tokens, cascade, args.block_size, args.shared, kv_dtype, matmul,
                            args.pool_pages)
        arms[key] = result
        report[key] = {"kv_dtype": kv_dtype, "matmul": matmul, **{k: v for k, v in result.items() if k != "tokens"}}
        print(key, json.dumps(report[key]), flush=True)
        save()
    report["cascade_vs_flat_tokens"] = agreement(arms["cascade"]["tokens"], arms["flat"]["tokens"])
    for kv in kv_dtypes[1:]:
        report[f"{kv}_vs_{kv_dtypes[0]}_flat_tokens"] = agreement(arms[f"flat_{kv}"]["tokens"], arms["flat"]["tokens"])
    for matmul in matmuls[1:]:
        report[f"cascade_{matmul}_vs_flat_tokens"] = agreement(arms[f"cascade_{matmul}"]["tokens"],
                                                               arms["flat"]["tokens"])
    report["reads_agree"] = {name: arms[name]["tokens"] == arms[f"{name}_2"]["tokens"]
                             for name in arms if not name.endswith("_2")}
    save()      # the token checks are kept even where mlx-lm's arm does not fit the GPU
    if not args.skip_mlx_lm:
        # mlx-lm's batch of 8K prompts peaks near the whole GPU: the engine's traces (one per ops and batch
        # layout, each holding its graph's buffers) go first.
        for layer in loaded.model.layers:
            layer.halves.forget_traces()
        gc.collect()
        mx.clear_cache()
        report["active_gb_before_mlx_lm"] = mx.get_active_memory() / 1e9
        try:
            arms["mlx_lm"] = mlx_lm_arm(stock, batch, args.new_tokens)
        except RuntimeError as error:   # its batch of 8K prompts does not fit an 80 GB card
            if "out of memory" not in str(error):
                raise
            report["mlx_lm"] = {"error": str(error)}
            gc.collect()
            mx.clear_cache()
        else:
            report["mlx_lm"] = {k: v for k, v in arms["mlx_lm"].items() if k != "tokens"}
            report["flat_vs_mlx_lm_tokens"] = agreement(arms["flat"]["tokens"], arms["mlx_lm"]["tokens"])
        print("mlx_lm", json.dumps(report["mlx_lm"]), flush=True)
    save()
    mx.clear_cache()
    checked = scored_rows(report, args.concurrency)
    report["teacher_forced"] = {name: {row: teacher_forced(stock, batch[row], arm["tokens"][row])
                                       for row in checked} for name, arm in arms.items() if not name.endswith("_2")}
    print("teacher_forced", json.dumps(report["teacher_forced"]), flush=True)
    save()

    text = markdown(report)
    (args.out / "e2e_bench.md").write_text(text)
    print(text)


def markdown(report: dict) -> str:
    """The arms' table and the token checks, from a report (e2e_bench.json)."""
    def ms(value):
        return "" if value is None else f"{value:.2f}"

    arms = [name for name in report if isinstance(report[name], dict) and "decode_tokens_per_s" in report[name]]
    rows = [f"| {name} | {report[name]['decode_tokens_per_s']:.0f} | {report[name]['median_step_ms']:.2f} "
            f"| {ms(report[name].get('median_host_ms'))} | {ms(report[name].get('median_device_ms'))} "
            f"| {report[name]['full_decode_steps']} | {report[name]['total_s']:.1f} "
            f"| {report[name]['peak_memory_gb']:.1f} |" for name in arms]
    checks = {k: report[k] for k in report if k.endswith("_tokens") or k in ("reads_agree", "teacher_forced", "fit")}
    return ("| arm | decode tok/s | median step ms | host ms | device ms | steps | total s | peak GB |\n"
            "|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n```\n"
            + json.dumps(checks, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
