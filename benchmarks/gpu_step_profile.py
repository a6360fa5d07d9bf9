"""Where an engine decode step's time goes, step by step.

    python benchmarks/gpu_step_profile.py --out OUTDIR                 # H200: the 8B-shaped random model
    python benchmarks/gpu_step_profile.py --out OUTDIR --model PATH    # any model directory (CPU: the tiny one)

For each arm (cascade on, off) the engine serves ``sessions`` prompts behind
a ``shared``-token prefix, ``new_tokens`` greedy tokens each, and for every
full-batch decode step reports its wall time, the engine's host time
(scheduling, planning, building the graph) and the rest, MLX's (encoding and
running the kernels, waiting for them), from the engine's own step records,
and of MLX's part the time inside ``mx.async_eval`` (encoding).
On a CUDA device with torch importable, ``profile_steps`` steady decode steps
also run under PyTorch's profiler (CUPTI sees MLX's kernels): kernels per step
and the GPU's busy time per step (union of kernel intervals) against the
window's wall time.

The byte floor of a step is what it must read at least: every weight once
(the model's own arrays; an untied embedding table is only gathered from) and
the KV pages its attention reads (cascade: each shared page once; flat: every
row's pages), over the copy bandwidth measured in the same run. Writes
step_profile.json and step_profile.md. ``--kv-dtypes bfloat16,int8`` profiles both arms
of every KV page format, so a quantized format's extra kernels show beside the first's.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

import gpu_e2e_bench as e2e
from gpu_timeline import complete_events, union_length
from mlxcel.engine.engine import Engine
from mlxcel.engine.model import LoadedModel, load_model
from mlxcel.kernels.layer_ops import LAYER_OPS_ENV

ARMS = {"cascade": True, "flat": False}
# --compare-layer-ops adds these: the same steps with the layer ops as MLX's own ops (layer_ops.COMPOSED).
COMPOSED_ARMS = {"cascade_composed": True, "flat_composed": False}


def copy_bandwidth(mib: int) -> float:
    """Bytes read plus written per second by an elementwise copy through MLX (best of 5)."""
    a = mx.random.normal((mib * 2**20 // 4,))
    mx.eval(a)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        mx.eval(a + 1)
        best = min(best, time.perf_counter() - start)
    return 2 * a.nbytes / best


def weight_bytes(loaded: LoadedModel) -> int:
    """Bytes a decode step reads of the model's weights."""
    total = sum(v.nbytes for _, v in tree_flatten(loaded.model.parameters()))
    if not loaded.model.args.tie_word_embeddings:   # the table is gathered from, not read whole
        total -= loaded.model.model.embed_tokens.weight.nbytes
    return total


def kv_bytes(engine: Engine, cascade: bool) -> int:
    """KV bytes one decode step's attention reads now, every layer."""
    views = engine.snapshot.sequences
    pages = len({p for v in views for p in v.pages}) if cascade else sum(len(v.pages) for v in views)
    g = engine.pool.geometry
    return pages * g.bytes_per_block


def short_name(kernel: str) -> str:
    """A kernel's name without its argument list and namespaces (template constants kept, truncated)."""
    return kernel.split("(")[0].replace("void ", "").replace("mlx::core::cu::", "")[:80]


def gpu_profiler():
    try:
        import torch  # noqa: F401  (CUPTI through PyTorch's profiler)
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    if not mx.cuda.is_available():
        return None
    return lambda: profile(activities=[ProfilerActivity.CUDA])


class Window:
    """Opens the profiler at the first steady full-batch decode step, closes it ``steps`` steps later."""

    def __init__(self, profiler, sessions: int, steps: int, skip: int) -> None:
        self.profiler, self.sessions, self.steps, self.skip = profiler, sessions, steps, skip
        self.started = self.prof = None
        self.seen = self.first = 0
        self.result: dict = {}
        self.kv_bytes = 0

    def __call__(self, engine: Engine, index: int) -> None:
        running = len(engine.scheduler.running) == self.sessions and not engine.scheduler.prefilling
        if self.prof is None and running and not self.result:
            self.seen += 1
            if self.seen > self.skip:
                self.kv_bytes = kv_bytes(engine, engine.cascade.enabled)
                if self.profiler is None:
                    self.result = {"profiled": False}
                    return
                mx.synchronize()
                self.prof = self.profiler().__enter__()
                self.started, self.first = time.perf_counter(), index
        elif self.prof is not None and index - self.first == self.steps:
            mx.synchronize()
            wall = time.perf_counter() - self.started
            self.prof.__exit__(None, None, None)
            events = [e for e in complete_events(self.prof) if e.get("cat") == "kernel"]
            kernels = [(e["ts"], e["ts"] + e["dur"]) for e in events]
            names = collections.Counter(short_name(e["name"]) for e in events)
            busy = collections.Counter()
            durations = collections.defaultdict(list)
            for e in events:
                busy[short_name(e["name"])] += e["dur"]
                durations[short_name(e["name"])].append(e["dur"])
            # A kernel's spread over its calls: a stall (a page fault on a host-written buffer, a wait) shows
            # as a max far above the median, counted as busy time by the union above.
            spread = {n: (float(np.median(d)), float(max(d))) for n, d in durations.items()}
            longest = sorted(events, key=lambda e: -e["dur"])[:12]
            self.result = {"profiled": True, "steps": self.steps, "window_wall_ms_per_step": 1e3 * wall / self.steps,
                           "kernels_per_step": len(kernels) / self.steps,
                           "gpu_busy_ms_per_step": union_length(kernels) / 1e3 / self.steps,
                           "kernels_by_name_per_step": {n: (c / self.steps, busy[n] / 1e3 / self.steps)
                                                        for n, c in names.most_common(40)},
                           "kernel_us_median_max": {n: spread[n] for n, _ in names.most_common(40)},
                           "longest_kernels_us": [(short_name(e["name"]), e["dur"]) for e in longest]}
            self.result["gpu_busy_share"] = self.result["gpu_busy_ms_per_step"] / self.result["window_wall_ms_per_step"]
            self.prof = None


@contextlib.contextmanager
def timed_async_eval():
    """The seconds of every mx.async_eval call meanwhile, in order: the engine makes one a step (MLX encoding
    the step's kernels; it waits only once ten committed graphs are in flight)."""
    real, seconds = mx.async_eval, []

    def timed(*arrays):
        start = time.perf_counter()
        real(*arrays)
        seconds.append(time.perf_counter() - start)

    mx.async_eval = timed
    try:
        yield seconds
    finally:
        mx.async_eval = real


def profile_arm(loaded: LoadedModel, batch: list[list[int]], args, cascade: bool, kv_dtype: str | None,
                bandwidth: float, weights: int) -> dict:
    engine = e2e.make_engine(loaded, batch, args.new_tokens, cascade, args.block_size, args.shared, kv_dtype)
    window = Window(gpu_profiler(), len(batch), args.profile_steps, args.skip_steps)
    with timed_async_eval() as encode_s:
        run = e2e.run_engine(engine, batch, args.new_tokens, window)
    records = [r for r in engine.snapshot.recent_steps if r.kind == "decode" and r.batch == len(batch)]
    e2e.release(engine)
    floor_s = (weights + window.kv_bytes) / bandwidth
    wall = statistics.median(r.seconds for r in records)
    encode = statistics.median(encode_s[r.step - 1] for r in records)   # step n's graph: the n-th call
    device = statistics.median(r.device_seconds for r in records)
    return {"tokens_per_s": run["decode_tokens_per_s"], "steps": len(records),
            "wall_ms": 1e3 * wall, "host_ms": 1e3 * statistics.median(r.host_seconds for r in records),
            "device_ms": 1e3 * device, "encode_ms": 1e3 * encode,
            "wall_ms_each": [round(1e3 * r.seconds, 3) for r in records],
            "host_ms_each": [round(1e3 * r.host_seconds, 3) for r in records],
            "kv_bytes_per_step": window.kv_bytes, "floor_ms": 1e3 * floor_s, "wall_over_floor": wall / floor_s,
            **window.result, "tokens": run["tokens"]}


def table(report: dict) -> str:
    lines = [f"{report['device']}; weights {report['weight_bytes'] / 1e9:.3f} GB; copy bandwidth "
             f"{report['copy_bandwidth_Bps'] / 1e9:.0f} GB/s; {report['sessions']} sessions x {report['shared']} "
             "shared tokens", "",
             "| arm | tok/s | step ms | host ms | encode ms | device ms | KV GB | floor ms | / floor | kernels "
             "| GPU ms | GPU % |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in report["arms"].items():
        gpu = (f"{r['kernels_per_step']:.0f} | {r['gpu_busy_ms_per_step']:.2f} | {100 * r['gpu_busy_share']:.0f}%"
               if r.get("profiled") else " |  | ")
        lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {r['wall_ms']:.2f} | {r['host_ms']:.2f} "
                     f"| {r['encode_ms']:.2f} | {r['device_ms']:.2f} | {r['kv_bytes_per_step'] / 1e9:.2f} "
                     f"| {r['floor_ms']:.2f} "
                     f"| {r['wall_over_floor']:.2f} | {gpu} |")
    return "\n".join(lines)


def markdown(report: dict) -> str:
    """The arms' table, the token check and each arm's kernels, from a report (step_profile.json)."""
    text = (table(report) + "\n\ntokens against the cascade arm's:\n\n```\n"
            + json.dumps(report["arms_agree"], indent=1) + "\n```\n")
    for name, arm in report["arms"].items():
        if arm.get("kernels_by_name_per_step"):
            text += f"\n{name}, kernels per step (count, GPU ms):\n\n" + "\n".join(
                f"- {n}: {c:.1f}, {ms:.3f}" + (" (us a call, median / max: {:.1f} / {:.1f})".format(
                    *arm["kernel_us_median_max"][n]) if n in arm.get("kernel_us_median_max", {}) else "")
                for n, (c, ms) in arm["kernels_by_name_per_step"].items()) + "\n"
        if arm.get("longest_kernels_us"):
            text += f"\n{name}, the longest calls in the window (us):\n\n" + "\n".join(
                f"- {n}: {us:.1f}" for n, us in arm["longest_kernels_us"]) + "\n"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", type=Path, help="a model directory (default: the 8B-shaped random model)")
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/qwen3-8b-random"),
                        help="where the random model's config and tokenizer files are written")
    parser.add_argument("--layers", type=int, default=e2e.QWEN3_8B["num_layers"])
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--shared", type=int, default=8192)
    parser.add_argument("--suffix", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--skip-steps", type=int, default=8, help="full-batch steps before the window opens")
    parser.add_argument("--copy-mib", type=int, default=1024)
    parser.add_argument("--kv-dtypes", default="bfloat16",
                        help="comma-separated KV page formats; each gets both arms (after the first: _<format>)")
    parser.add_argument("--compare-layer-ops", action="store_true",
                        help=f"also run each arm with {LAYER_OPS_ENV}=composed (MLX's ops for the layer ops)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    if not args.model:   # the random model: the bound the serve command sets for the bench's pool
        lengths = e2e.prompts(args.sessions, args.shared, args.suffix)   # (their ids come after the load)
        e2e.widen_graph_bound(args.layers, args.block_size,
                              e2e.engine_pages(lengths, args.new_tokens, args.block_size, args.shared))
    loaded = load_model(args.model) if args.model else e2e.random_models(args.model_dir, args.layers)[1]
    vocab = loaded.vocab_size
    batch = e2e.prompts(args.sessions, args.shared, args.suffix, vocab=vocab)
    report = {"device": str(mx.default_device()), "model": loaded.name, "sessions": args.sessions,
              "mlx_graph_limits": {k: os.environ.get(k) for k in e2e.MLX_GRAPH_LIMITS},
              "shared": args.shared, "new_tokens": args.new_tokens,
              "copy_bandwidth_Bps": copy_bandwidth(args.copy_mib), "weight_bytes": weight_bytes(loaded), "arms": {}}
    kv_dtypes = args.kv_dtypes.split(",")
    arms = {**ARMS, **COMPOSED_ARMS} if args.compare_layer_ops else ARMS
    arms = {name + ("" if kv == kv_dtypes[0] else "_" + kv): (cascade, kv)
            for kv in kv_dtypes for name, cascade in arms.items()}
    e2e.warm_up(loaded, batch, args.block_size, args.shared, tuple(kv_dtypes), new_tokens=args.new_tokens)
    for name, (cascade, kv) in sorted(arms.items(), key=lambda arm: not arm[1][0]):   # cascade arms side by side
        os.environ[LAYER_OPS_ENV] = "composed" if "_composed" in name else ""
        report["arms"][name] = profile_arm(loaded, batch, args, cascade, kv, report["copy_bandwidth_Bps"],
                                           report["weight_bytes"])
        print(name, json.dumps({k: v for k, v in report["arms"][name].items() if not k.endswith("each")
                                and k != "tokens"}), flush=True)
    tokens = {name: arm.pop("tokens") for name, arm in report["arms"].items()}
    report["arms_agree"] = {name: e2e.agreement(tokens["cascade"], row_tokens)
                            for name, row_tokens in tokens.items() if name != "cascade"}
    report["distinct_tokens"] = len({t for row in tokens["cascade"] for t in row})
    (args.out / "step_profile.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (args.out / "step_profile.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
