"""Layer-level decode attention: flat fused_v2 launch vs cascade, per cell of
shared span x batch, plus the no-sharing overhead gate.

    python benchmarks/cascade_attention_bench.py --shared 2048,8192 --batches 4,8 \
        --tail 256 --steps 200 --warmup 40 --reps 5

Every step builds a fresh page-table view (a new page structure), so the
cascade arm pays the detection scan and the level-1 layout derivation every
step: the worst case for the overhead gate, where a real engine keeps its
decode plan while block tables are unchanged. Both arms' outputs are compared (and checked
against the float64 reference) before any timing is trusted. Arms are
interleaved step by step so drift hits both alike; each figure is the median over
reps of the per-step mean.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import mlx.core as mx
import numpy as np

from mlxcel.engine.attention import cascade_layout
from mlxcel.engine.cascade import explain_cascade, plan_cascade
from mlxcel.engine.decode_plan import paged_decode_attention
from mlxcel.engine.config import CascadeConfig
from mlxcel.engine.metrics import EngineMetrics
from mlxcel.kernels import PagedCsrView, backend_name
from mlxcel.kernels.csr import HostCsr, host_csr
from mlxcel.kernels.portable import page_tiles
from mlxcel.kernels.reference import reference_decode
from mlxcel.engine.allocator import keep_heap
from mlxcel.engine.blas import describe

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def page_tables(shared: int, tail: int, batch: int, block_size: int, sharing: bool) -> HostCsr:
    """Rows of ``shared + tail`` tokens; with sharing, the shared pages are one
    set of block ids every row holds, else every row has its own."""
    shared_pages, tail_pages = -(-shared // block_size), -(-tail // block_size)
    next_block = shared_pages if sharing else 0
    tables = []
    for _ in range(batch):
        own = tail_pages if sharing else shared_pages + tail_pages
        private = list(range(next_block, next_block + own))
        next_block += own
        tables.append((list(range(shared_pages)) if sharing else []) + private)
    return host_csr(tables, [shared + tail] * batch, block_size)


class Cell:
    def __init__(self, args, shared: int, batch: int, sharing: bool) -> None:
        self.host = page_tables(shared, args.tail, batch, args.block_size, sharing)
        blocks = int(self.host.indices.max()) + 1
        shape = (blocks, args.block_size, args.kv_heads, args.head_dim)
        dtype = DTYPES[args.dtype]
        self.k_pool = mx.random.normal(shape).astype(dtype)
        self.v_pool = mx.random.normal(shape).astype(dtype)
        self.q = mx.random.normal((batch, args.heads, args.head_dim))
        self.scale = args.head_dim ** -0.5
        mx.eval(self.k_pool, self.v_pool, self.q)

    def step(self, config: CascadeConfig, metrics: EngineMetrics) -> mx.array:
        view = PagedCsrView.from_host(self.host)    # fresh structure: plan + layout derived again
        o = paged_decode_attention(self.q, self.k_pool, self.v_pool, view, scale=self.scale,
                                   config=config, metrics=metrics)
        mx.eval(o)
        return o

    def time_steps(self, config: CascadeConfig, metrics: EngineMetrics, steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            self.step(config, metrics)
        return (time.perf_counter() - start) / steps


def load() -> str:
    """1-minute load average after a cell: above ~1 (this process) means
    something else shared the cores while it ran."""
    return f"{os.getloadavg()[0]:.2f}"


def launch_stats(metrics: EngineMetrics) -> str:
    def value(name: str, labels: dict | None = None) -> float:
        return metrics.registry.get_sample_value(name, labels or {}) or 0.0

    fused = value("mlxcel_paged_decode_launches_total", {"path": "fused_v2"})
    cascades = value("mlxcel_paged_decode_launches_total", {"path": "cascade"})
    text = f"fused_v2 {fused:.0f}, cascade {cascades:.0f}"
    if cascades:
        text += (f" (mean {value('mlxcel_cascade_shared_tokens_total') / cascades:.0f} shared tokens, "
                 f"{value('mlxcel_cascade_member_sequences_total') / cascades:.1f} members)")
    failures = value("mlxcel_cascade_failures_total")
    return text + (f", failures {failures:.0f}" if failures else "")


def compare_arms(cell: Cell, arms: dict[str, CascadeConfig], args, reps: int
                 ) -> tuple[dict[str, list[float]], dict[str, EngineMetrics], list[float]]:
    """Per-rep mean step time of each arm, and the ratio second/first arm of
    every adjacent pair of steps. Arms alternate step by step (in alternating
    order), so drift and noisy neighbours hit both alike."""
    metrics = {name: EngineMetrics() for name in arms}
    for name, config in arms.items():
        for _ in range(args.warmup):
            cell.step(config, metrics[name])
    names = list(arms)
    times: dict[str, list[float]] = {name: [] for name in arms}
    pair_ratios: list[float] = []
    for _ in range(reps):
        total = dict.fromkeys(names, 0.0)
        for i in range(args.steps):
            took = {}
            for name in (names if i % 2 == 0 else names[::-1]):
                start = time.perf_counter()
                cell.step(arms[name], metrics[name])
                took[name] = time.perf_counter() - start
                total[name] += took[name]
            pair_ratios.append(took[names[1]] / took[names[0]])
        for name in names:
            times[name].append(total[name] / args.steps)
    return times, metrics, pair_ratios


def gathered_mb(cell: Cell, config: CascadeConfig) -> float:
    """K and V bytes one step gathers, padding included."""
    view = PagedCsrView.from_host(cell.host)
    plan = plan_cascade(view, config) if config.enabled else None
    if plan is None:
        views = [view]
    else:
        layout = cascade_layout(view, plan)
        views = [level.view for level in layout.levels] + [layout.private_view(view)]
    page_bytes = cell.k_pool[0].nbytes
    return sum(2 * page_bytes * t.num_tiles * t.width for t in map(page_tiles, views)) / 1e6


def scan_seconds(cell: Cell, config: CascadeConfig, repeats: int = 200) -> float:
    """Median time of the detection scan on a fresh layout (what the on arm adds)."""
    samples = []
    for _ in range(repeats):
        view = PagedCsrView.from_host(cell.host)
        start = time.perf_counter()
        explain_cascade(view, config.snapshot())
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def sweep(args) -> None:
    off = CascadeConfig(enabled=False)
    on = CascadeConfig(enabled=True, min_shared_pages=args.min_shared_pages, min_members=args.min_members)
    print(f"# cascade attention, layer level: Hq={args.heads} Hkv={args.kv_heads} D={args.head_dim} "
          f"block {args.block_size}, {args.dtype} pool, tail {args.tail}; steps {args.steps}, warmup "
          f"{args.warmup}, reps {args.reps}; {backend_name()} kernels, MLX {mx.__version__}, "
          f"{mx.default_device()}, {platform.machine()}; {describe()}; glibc heap "
          f"{'kept (as the CLI runs)' if args.heap_kept else 'defaults'}\n")
    if "sweep" in args.parts:
        flat_vs_cascade(args, off, on)
    if "gate" in args.parts:
        overhead_gate(args, off, on)


def flat_vs_cascade(args, off: CascadeConfig, on: CascadeConfig) -> None:
    print("| shared | batch | flat ms | cascade ms | flat/cascade | KV MB gathered flat / cascade "
          "| max abs diff flat vs cascade | cascade vs f64 ref | flat arm launches | cascade arm launches | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for shared in args.shared:
        for batch in args.batches:
            cell = Cell(args, shared, batch, sharing=True)
            flat = np.array(cell.step(off, EngineMetrics()))
            cascade = np.array(cell.step(on, EngineMetrics()))
            diff = float(np.abs(flat - cascade).max())
            ref = float(np.abs(cascade - reference_decode(cell.q, cell.k_pool, cell.v_pool, cell.host,
                                                          cell.scale)).max())
            if diff > args.tolerance or ref > args.tolerance:
                raise SystemExit(f"arms disagree at shared {shared} batch {batch}: {diff:.3g} / {ref:.3g}")
            times, metrics, _ = compare_arms(cell, {"flat": off, "cascade": on}, args, args.reps)
            f, c = statistics.median(times["flat"]), statistics.median(times["cascade"])
            mb = f"{gathered_mb(cell, off):.1f} / {gathered_mb(cell, on):.1f}"
            print(f"| {shared} | {batch} | {f * 1e3:.2f} | {c * 1e3:.2f} | {f / c:.2f}x | {mb} | {diff:.2e} | {ref:.2e} "
                  f"| {launch_stats(metrics['flat'])} | {launch_stats(metrics['cascade'])} | {load()} |", flush=True)
            del cell


def overhead_gate(args, off: CascadeConfig, on: CascadeConfig) -> None:
    print("\n## No-sharing overhead gate (same shapes, every row its own pages; cascade off vs on = "
          "without vs with the detection scan). overhead: medians of rep means; paired overhead: "
          "median over adjacent step pairs of on/off; scan: the detection scan timed alone\n")
    print("| shared | batch | off ms | on ms | overhead | paired overhead | scan us/step | scan share of step "
          "| reps off ms | reps on ms | on-arm launches | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shared in args.shared:
        for batch in args.batches:
            cell = Cell(args, shared, batch, sharing=False)
            times, metrics, ratios = compare_arms(cell, {"off": off, "on": on}, args, args.gate_reps or args.reps)
            a, b = statistics.median(times["off"]), statistics.median(times["on"])
            reps_off = " ".join(f"{t * 1e3:.1f}" for t in times["off"])
            reps_on = " ".join(f"{t * 1e3:.1f}" for t in times["on"])
            scan = scan_seconds(cell, on)
            print(f"| {shared} | {batch} | {a * 1e3:.2f} | {b * 1e3:.2f} | {(b / a - 1) * 100:+.2f}% "
                  f"| {(statistics.median(ratios) - 1) * 100:+.2f}% | {scan * 1e6:.0f} | {scan / a * 100:.3f}% | {reps_off} | {reps_on} "
                  f"| {launch_stats(metrics['on'])} | {load()} |", flush=True)
            del cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=int_list, default=[2048, 8192], help="shared tokens per cell")
    parser.add_argument("--batches", type=int_list, default=[4, 8])
    parser.add_argument("--tail", type=int, default=256, help="private tokens per row")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per rep")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--gate-reps", type=int, default=0, help="reps for the overhead gate (default --reps)")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--min-shared-pages", type=int, default=16)
    parser.add_argument("--min-members", type=int, default=2)
    parser.add_argument("--parts", type=lambda t: t.split(","), default=["sweep", "gate"],
                        help="sweep (flat vs cascade), gate (no-sharing overhead), or both")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max abs diff allowed between arms")
    parser.add_argument("--glibc-defaults", action="store_true",
                        help="leave glibc's malloc thresholds alone (the CLI raises them: engine/allocator.py)")
    args = parser.parse_args()
    args.heap_kept = not args.glibc_defaults and keep_heap()
    sweep(args)


if __name__ == "__main__":
    main()
