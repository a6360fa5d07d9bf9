"""Decode attention on the GPU: fused flat, fused cascade, and MLX's own SDPA.

    python benchmarks/gpu_attention_bench.py --out OUTDIR

One decode-attention call per cell (Hq=32, Hkv=8, D=128, bf16, block size 32,
shared span S, private tail T per row, batch B):

- flat: the engine's decode plan with cascade off (fused kernel over every
  row's pages in place, tile merge when a row is split), planned once as the
  engine plans a step whose layout it has seen, then launched per call;
- cascade: the same with cascade on (level 0 with all members' heads
  stacked, level 1, merge);
- sdpa: ``mx.fast.scaled_dot_product_attention`` over the same K/V gathered
  into contiguous [B, Hkv, S+T, D] arrays (what mlx-lm runs).

Outputs of the three are compared before any timing is trusted (and against
the float64 reference on the smallest cells). Two timings per method, medians
over repeats after a warm-up, the methods of a cell interleaved (each repeat
times every method once, the order rotated from repeat to repeat):

- device: n calls chained by a data dependency (call i+1's q adds 0 x one
  element of call i's output, compiled into one kernel, so MLX's graph cannot
  overlap them), built first, then one mx.async_eval + mx.synchronize around
  all n. The per-call figure is the slope between a chain of n/4 calls and one
  of n (as Criterion's linear regression over iteration counts): a repeat's
  fixed costs (encoding the first CUDA graph before the GPU starts, the final
  synchronize) drop out instead of being spread over n, which the warm-up caps
  and which differs per method. The long chain's total over n is kept too
  ("incl. fixed", the figure the bench reported before it took the slope). The host's graph building
  is excluded and reported on its own (host ms), and so is the part of the
  timed span MLX spends encoding the calls into CUDA graphs (encode ms: close
  to the device time would mean the host, not the GPU, sets it). The
  chain's own op is timed alone as "chain" and subtracted for the net ratios:
  an upper bound, since alone the chain is host-bound (its encode time is most
  of it) and costs a GPU-bound method less than that.
- pipelined: n independent calls, each issued with mx.async_eval, closed by
  mx.synchronize: what a Python caller issuing one call at a time sees, host
  overhead included where it exceeds the device time.

KV dtypes (``--kv-dtypes``, or ``--kv-dtypes-only`` for nothing else): at one
cell (default 8192 shared x 32) the flat and cascade arms over bf16 pages and
over the same pages quantized to int8 and int4 (``kv_quant``), all timed
side by side in one ``measure_all``, each checked first against the portable
kernels over the same pages; the issue's kernel targets (int8 flat >= 1.6x
bf16 flat, int8 cascade >= 1.3x bf16 cascade, int4 flat >= 2.5x bf16 flat)
are reported met or missed.

Inputs rotate over enough copies to exceed twice the L2, so repeated calls do
not read a warm cache. Bytes are what each method must read and write at
least (flat and SDPA: every row's K/V; cascade: the shared span once plus the
tails); the copy bandwidth and the bf16 matmul rate are measured in the same
run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import statistics
import subprocess
import time
from dataclasses import replace
from functools import cached_property
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxcel.engine.attention import cascade_layout
from mlxcel.engine.cascade import plan_cascade
from mlxcel.engine.config import CascadeConfig
from mlxcel.engine.decode_plan import DecodePlan
from mlxcel.engine import cost_model
from mlxcel.engine.decode_plan import decide_step
from mlxcel.kernels import AttentionShape, PagedCsrView, backend, backend_name, fused_takes, portable
from mlxcel.kernels.csr import host_csr
from mlxcel.kernels.kv_quant import FORMATS, QuantizedPages, quantize
from mlxcel.kernels.reference import reference_decode

HQ, HKV, D, BLOCK = 32, 8, 128, 32
DTYPE = mx.bfloat16
L2_BYTES = 60 * 2**20
ON = CascadeConfig(enabled=True, min_shared_pages=16, min_members=2)
OFF = CascadeConfig(enabled=False)


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def device_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,memory.total",
                               "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return platform.processor()


@mx.compile
def depend(x: mx.array, previous: mx.array) -> mx.array:
    """x plus 0 x previous's first element: one fused kernel, no change to x."""
    return x + (previous.reshape(-1)[:1] * 0).astype(x.dtype)


def chain(call, n: int) -> mx.array:
    """n calls, call i+1 depending on call i's output (passed as its dep)."""
    out = None
    for i in range(n):
        out = call(i, out)
    return out


def timed_chain(call, n: int) -> tuple[float, float, float]:
    """n chained calls: (device, host build, encode) seconds in all."""
    mx.synchronize()
    start = time.perf_counter()
    out = chain(call, n)
    built = time.perf_counter()
    mx.async_eval(out)
    encoded = time.perf_counter()
    mx.synchronize()
    done = time.perf_counter()
    return done - built, built - start, encoded - built


def chained_rep(call, n: int) -> tuple[float, float, float, float]:
    """One repeat: per-call (device slope, host build, encode, device incl. fixed costs) seconds,
    from chains of n // 4 and n calls."""
    short = max(1, n // 4)
    short_device, _, _ = timed_chain(call, short)
    device, host, encode = timed_chain(call, n)
    return (device - short_device) / (n - short), host / n, encode / n, device / n


def pipelined_rep(call, n: int) -> float:
    """One repeat of n independent calls, each issued with mx.async_eval: per-call seconds."""
    mx.synchronize()
    start = time.perf_counter()
    for i in range(n):
        mx.async_eval(call(i, None))
    mx.synchronize()
    return (time.perf_counter() - start) / n


def calls_per_repeat(call, budget: float) -> int:
    """Warm up (compiles), then size a repeat to ~``budget`` seconds."""
    for i in range(3):
        mx.eval(call(i, None))
    start = time.perf_counter()
    for i in range(5):
        mx.eval(call(i, None))
    each = (time.perf_counter() - start) / 5
    return max(8, min(200, int(budget / max(each, 1e-6))))


def measure_all(calls: dict, reps: int, budget: float = 0.03) -> dict:
    """Per-call seconds of each named call, medians over ``reps`` repeats (and
    IQRs). The calls are timed interleaved: every repeat times each once, in
    an order rotated from repeat to repeat, so no call always runs first (run
    25 found the call timed first after a cell's arrays are made reading up
    to 40% slow)."""
    names = list(calls)
    sizes = {name: calls_per_repeat(calls[name], budget) for name in names}
    rotations = [names[rep % len(names):] + names[:rep % len(names)] for rep in range(reps)]
    chained = {name: [] for name in names}
    pipelined = {name: [] for name in names}
    for order in rotations:
        for name in order:
            chained[name].append(chained_rep(calls[name], sizes[name]))
    for order in rotations:
        for name in order:
            pipelined[name].append(pipelined_rep(calls[name], sizes[name]))

    def stats(xs: list[float]) -> tuple[float, float]:
        q1, _, q3 = statistics.quantiles(xs, n=4)
        return statistics.median(xs), q3 - q1

    results = {}
    for name in names:
        device, host, encode, with_fixed = zip(*chained[name])
        (d, d_iqr), (h, _), (e, _), (f, _), (p, p_iqr) = (stats(device), stats(host), stats(encode),
                                                          stats(with_fixed), stats(pipelined[name]))
        results[name] = {"s": d, "iqr_s": d_iqr, "host_s": h, "encode_s": e, "chained_s": f,
                         "pipelined_s": p, "pipelined_iqr_s": p_iqr}
    return results


def measure(call, reps: int, budget: float = 0.03) -> dict:
    return measure_all({"call": call}, reps, budget)["call"]


def copy_bandwidth(reps: int, mib: int) -> float:
    """Bytes read + written per second by an elementwise op (x + 1) on ``mib`` MiB."""
    x = mx.random.normal((mib * 2**19,)).astype(DTYPE)
    mx.eval(x)
    return 2 * x.nbytes / measure(lambda i, dep: x + 1 if dep is None else depend(x, dep), reps)["s"]


def matmul_rate(reps: int, n: int) -> float:
    a, b = (mx.random.normal((n, n)).astype(DTYPE) for _ in range(2))
    mx.eval(a, b)
    return 2 * n**3 / measure(lambda i, dep: (a if dep is None else depend(a, dep)) @ b, reps, 0.2)["s"]


class Cell:
    """One (shared, batch) cell: pools, queries and contiguous K/V, ``sets`` copies."""

    def __init__(self, shared: int, tail: int, batch: int) -> None:
        self.shared, self.tail, self.batch = shared, tail, batch
        shared_pages, tail_pages = shared // BLOCK, tail // BLOCK
        tables = [list(range(shared_pages)) + list(range(shared_pages + r * tail_pages,
                                                          shared_pages + (r + 1) * tail_pages))
                  for r in range(batch)]
        self.host = host_csr(tables, [shared + tail] * batch, BLOCK)
        self.csr = PagedCsrView.from_host(self.host)
        self.blocks = shared_pages + batch * tail_pages
        self.tokens = shared + tail
        kv_bytes_per_token = HKV * D * 2 * 2
        qo_bytes = batch * HQ * D * 2 * 2
        self.flat_bytes = batch * self.tokens * kv_bytes_per_token + qo_bytes
        self.cascade_bytes = (shared + batch * tail) * kv_bytes_per_token + qo_bytes
        contiguous = batch * self.tokens * kv_bytes_per_token
        self.sets = max(1, min(8, math.ceil(2 * L2_BYTES / contiguous)))
        pool_shape = (self.blocks, BLOCK, HKV, D)
        self.k_pools, self.v_pools, self.queries = [], [], []
        for _ in range(self.sets):
            self.k_pools.append(mx.random.normal(pool_shape).astype(DTYPE))
            self.v_pools.append(mx.random.normal(pool_shape).astype(DTYPE))
            self.queries.append(mx.random.normal((batch, HQ, D)).astype(DTYPE))
        mx.eval(self.k_pools, self.v_pools, self.queries)
        self.scale = D ** -0.5
        self.pages = mx.array(np.stack([self.host.pages(r) for r in range(batch)]))

    def contiguous(self, pool: mx.array) -> mx.array:
        """[B, Hkv, S+T, D]: every row's pages gathered in order."""
        rows = pool[self.pages].reshape(self.batch, -1, HKV, D)
        return mx.contiguous(rows.transpose(0, 2, 1, 3))

    def query(self, i: int, dep: mx.array | None) -> mx.array:
        q = self.queries[i % self.sets]
        return q if dep is None else depend(q, dep)

    @property
    def shape(self) -> AttentionShape:
        return AttentionShape(HQ, HKV, D, DTYPE, DTYPE, BLOCK, self.scale)

    @cached_property
    def plans(self) -> dict[str, DecodePlan]:
        """The engine's plans of this cell, made at first use, every span
        kept whatever the cost model says (see run_cell)."""
        with every_span_kept():
            return {name: DecodePlan(self.csr, config.snapshot(), self.shape) for name, config in
                    (("flat", OFF), ("cascade", ON))}

    def flat(self, i: int, dep: mx.array | None = None) -> mx.array:
        s = i % self.sets
        return self.plans["flat"].attend(self.query(i, dep), self.k_pools[s], self.v_pools[s], self.csr.last_page_len)

    def cascade(self, i: int, dep: mx.array | None = None) -> mx.array:
        s = i % self.sets
        return self.plans["cascade"].attend(self.query(i, dep), self.k_pools[s], self.v_pools[s],
                                            self.csr.last_page_len)

    def sdpa_call(self):
        """MLX SDPA over contiguous copies of the same K/V, [B, Hq, D] out."""
        kv = [(self.contiguous(k), self.contiguous(v)) for k, v in zip(self.k_pools, self.v_pools)]
        mx.eval(kv)

        def sdpa(i: int, dep: mx.array | None = None) -> mx.array:
            k, v = kv[i % self.sets]
            q = self.query(i, dep)[:, :, None, :]
            return mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale)[:, :, 0]
        return sdpa

    def chain_only(self, i: int, dep: mx.array | None = None) -> mx.array:
        """The timing chain's own ops, nothing else."""
        return self.query(i, dep)

    @cached_property
    def cascade_views(self):
        """This cell's cascade plan, its layout and level 1's page view."""
        plan = plan_cascade(self.csr, ON)
        layout = cascade_layout(self.csr, plan)
        return plan, layout, layout.private_view(self.csr)

    def fused_cascade(self, level0_pages: int | None, level0_warps_m: int | None = None,
                      level0_warps: int | None = None, level0_stages: int | None = None):
        """The fused backend's cascade step with level 0's tile width,
        head-splitting warps, block warps and staging ring fixed (sweeps;
        None: the heuristics)."""
        plan, layout, private = self.cascade_views
        step = backend().KERNELS.prepare_cascade(self.shape, self.batch, private, layout.kernel_levels,
                                                 level0_pages, level0_warps_m, level0_warps, level0_stages)

        def call(i: int, dep: mx.array | None = None) -> mx.array:
            s = i % self.sets
            return step(self.query(i, dep), self.k_pools[s], self.v_pools[s], private.last_page_len)
        return call

    def fused_levels(self) -> dict:
        """Level 0 alone and level 1 alone, launched as the fused cascade step
        launches them; the cascade merge is the rest of the step."""
        plan, layout, private = self.cascade_views
        kernels = backend().KERNELS
        (level0,), level1 = kernels.cascade_levels(HQ, HKV, private, layout.kernel_levels)
        shared = layout.levels[0]

        def level(csr: PagedCsrView, heads_and_tiles, member_list):
            heads, tiles = heads_and_tiles

            def call(i: int, dep: mx.array | None = None) -> mx.array:
                s = i % self.sets
                return kernels.partial_tiles(self.query(i, dep), self.k_pools[s], self.v_pools[s], csr,
                                             tiles.geometry, heads, self.scale, member_list)[0]
            return call
        return {"level0": level(shared.view, level0, mx.array(shared.members)), "level1": level(private, level1, None)}


@contextlib.contextmanager
def every_span_kept():
    """Plans made inside keep every span the thresholds allow: the benchmarks
    time cascades the device's cost model may decline (and record its verdict)."""
    measured = cost_model.current
    cost_model.current = lambda measure: None
    try:
        yield
    finally:
        cost_model.current = measured


def relative_error(got: mx.array, want) -> float:
    got = np.array(got.astype(mx.float32), np.float64)
    want = np.asarray(want if not isinstance(want, mx.array) else want.astype(mx.float32), np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def run_cell(args, shared: int, batch: int, copy_bw: float) -> dict:
    cell = Cell(shared, args.tail, batch)
    plan = plan_cascade(cell.csr, ON)
    sdpa = cell.sdpa_call()
    # The decode path declines plans its measured cost model says do not pay;
    # time the cascade anyway and record whether the engine would choose it.
    verdict = decide_step(cell.csr, ON.snapshot(), cell.shape, nested=True)
    chosen = verdict.plan is not None
    flat, cascaded, reference = cell.flat(0), cell.cascade(0), sdpa(0)
    checks = {"flat_vs_sdpa": relative_error(flat, reference), "cascade_vs_sdpa": relative_error(cascaded, reference),
              "cascade_vs_flat": relative_error(cascaded, flat)}
    if shared * batch <= args.reference_limit:
        ref = reference_decode(cell.queries[0], cell.k_pools[0], cell.v_pools[0], cell.host, cell.scale)
        checks.update(flat_vs_float64=relative_error(flat, ref), cascade_vs_float64=relative_error(cascaded, ref),
                      sdpa_vs_float64=relative_error(reference, ref))
    if max(checks.values()) > args.tolerance:
        raise SystemExit(f"outputs disagree at shared={shared} batch={batch}: {checks}")

    result = {"shared": shared, "tail": args.tail, "batch": batch, "sets": cell.sets, "checks": checks,
              "plan": {"members": len(plan.members), "shared_pages": plan.shared_pages, "chosen": chosen,
                       "predicted_saving_s": verdict.predicted_saving_s},
              "flat_bytes": cell.flat_bytes, "cascade_bytes": cell.cascade_bytes,
              "cascade_floor_s": cell.cascade_bytes / copy_bw, "flat_floor_s": cell.flat_bytes / copy_bw}
    arms = {"chain": cell.chain_only, "sdpa": sdpa, "flat": cell.flat, "cascade": cell.cascade}
    for name, stats in measure_all(arms, args.reps).items():
        for key, value in stats.items():
            result[f"{name}_{key}"] = value
    return result


# The kernel targets: (arm, over arm, at least).
KV_TARGETS = [("int8_flat", "bf16_flat", 1.6), ("int8_cascade", "bf16_cascade", 1.3), ("int4_flat", "bf16_flat", 2.5)]


def kv_dtype_arms(args) -> dict:
    """Flat and cascade over bf16, int8 and int4 pages of one cell, timed
    side by side; every arm checked against the portable kernels over its own
    pages (the quantized pages' codes, so quantization error is not in the
    check) before any timing."""
    shared, batch = args.kv_cell
    cell = Cell(shared, args.tail, batch)
    pools = {"bf16": (cell.k_pools, cell.v_pools)}
    for name in ("int8", "int4"):
        fmt = FORMATS[name]
        pools[name] = ([QuantizedPages(*quantize(k, fmt)) for k in cell.k_pools],
                       [QuantizedPages(*quantize(v, fmt)) for v in cell.v_pools])
        mx.eval(pools[name])
    qo_bytes = batch * HQ * D * 2 * 2
    arms, checks, facts = {"chain": cell.chain_only}, {}, {}
    for dtype, (k_pools, v_pools) in pools.items():
        shape = replace(cell.shape, pool_dtype=k_pools[0].dtype)
        token_bytes = shape.page_bytes // BLOCK                     # K and V of every KV head, scales included
        with every_span_kept():
            plans = {name: DecodePlan(cell.csr, config.snapshot(), shape) for name, config in (("flat", OFF),
                                                                                               ("cascade", ON))}
        want = portable.paged_attention_partial(cell.queries[0], k_pools[0], v_pools[0], cell.csr, scale=cell.scale)[0]
        for name, plan in plans.items():
            def call(i: int, dep: mx.array | None = None, plan=plan, k_pools=k_pools, v_pools=v_pools) -> mx.array:
                s = i % cell.sets
                return plan.attend(cell.query(i, dep), k_pools[s], v_pools[s], cell.csr.last_page_len)
            arm = f"{dtype}_{name}"
            checks[arm] = relative_error(call(0), want)
            tokens = batch * cell.tokens if name == "flat" else shared + batch * args.tail
            facts[arm] = {"fused": fused_takes(shape), "bytes": tokens * token_bytes + qo_bytes}
            arms[arm] = call
    if max(checks.values()) > args.tolerance:
        raise SystemExit(f"KV dtype arms disagree with the portable kernels at {shared} x {batch}: {checks}")
    timed = measure_all(arms, args.reps)
    chain = timed["chain"]["s"]
    targets = []
    for arm, over, at_least in KV_TARGETS:
        ratio = timed[over]["s"] / timed[arm]["s"]
        net = (timed[over]["s"] - chain) / (timed[arm]["s"] - chain)
        targets.append({"arm": arm, "over": over, "target": at_least, "ratio": ratio, "net_ratio": net,
                        "met": ratio >= at_least})
    return {"shared": shared, "tail": args.tail, "batch": batch, "sets": cell.sets, "checks": checks,
            "arms": {arm: {**facts.get(arm, {}), **stats} for arm, stats in timed.items()}, "targets": targets}


def kv_table(report: dict) -> str:
    lines = [f"KV dtypes at {report['shared']} shared x {report['batch']} (tail {report['tail']})", "",
             "| arm | ms | IQR ms | fused | MB | TB/s | vs portable |", "|---|---|---|---|---|---|---|"]
    for arm, r in report["arms"].items():
        if arm == "chain":
            lines.append(f"| chain | {r['s'] * 1e3:.3f} | {r['iqr_s'] * 1e3:.3f} | | | | |")
            continue
        lines.append(f"| {arm} | {r['s'] * 1e3:.3f} | {r['iqr_s'] * 1e3:.3f} | {'yes' if r['fused'] else 'no'} "
                     f"| {r['bytes'] / 1e6:.1f} | {r['bytes'] / r['s'] / 1e12:.2f} | {report['checks'][arm]:.1e} |")
    lines += ["", "| target | measured (net of the chain) | met |", "|---|---|---|"]
    lines += [f"| {t['arm']} >= {t['target']}x {t['over']} | {t['ratio']:.2f}x ({t['net_ratio']:.2f}x) "
              f"| {'met' if t['met'] else 'missed'} |" for t in report["targets"]]
    return "\n".join(lines)


def sweep_level0(args) -> list[dict]:
    """The fused cascade step against level 0's block warps, head-splitting
    warps, tile width and staging ring (None: the heuristic's choice) at the
    large cells: checks the heuristics. Every variant's output is checked
    against the flat launch before it is timed."""
    if not hasattr(backend(), "KERNELS"):
        return []
    results = []
    for shared, batch in args.sweep_cells:
        cell = Cell(shared, args.tail, batch)
        flat = cell.flat(0)
        layouts = ((None, None),) if args.sweep_stages_only else ((None, None), (4, 4), (8, 2), (8, 4), (8, 8))
        for warps, warps_m in layouts:
            for pages in (None, 16, 22, 32, 64):
                for stages in args.sweep_stages:
                    call = cell.fused_cascade(pages, warps_m, warps, stages)
                    error = relative_error(call(0), flat)
                    if error > args.tolerance:
                        raise SystemExit(f"level-0 variant warps={warps} warps_m={warps_m} pages={pages} "
                                         f"stages={stages} at {shared} x {batch} disagrees with flat: {error:.2e}")
                    results.append({"shared": shared, "batch": batch, "level0_warps": warps, "level0_pages": pages,
                                    "level0_warps_m": warps_m, "level0_stages": stages, "vs_flat": error,
                                    **measure(call, args.reps)})
                    print(json.dumps(results[-1]), flush=True)
    return results


def breakdown(args) -> dict:
    """Where a fused cascade step's time goes at the headline cell: the timing
    chain alone, each level alone, the 3-launch step, the engine's call."""
    if not hasattr(backend(), "KERNELS"):
        return {}
    cell = Cell(8192, args.tail, 32)
    calls = {"chain": cell.chain_only, **cell.fused_levels(), "cascade_decode": cell.fused_cascade(None),
             "decode_plan": cell.cascade}
    return measure_all(calls, args.reps)


def table(results: list[dict]) -> str:
    lines = ["| S | B | SDPA ms | flat ms | cascade ms | chain ms | flat/SDPA | SDPA/cascade (net) | cascade/flat (net) "
             "| SDPA/cascade incl. fixed | engine cascades "
             "| flat TB/s | cascade TB/s | cascade floor ms | host ms flat, cascade | encode ms SDPA, cascade "
             "| pipelined ms SDPA, flat, cascade |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        sdpa, flat, cascade, chain = r["sdpa_s"], r["flat_s"], r["cascade_s"], r["chain_s"]
        lines.append(
            f"| {r['shared']} | {r['batch']} | {sdpa * 1e3:.3f} | {flat * 1e3:.3f} | {cascade * 1e3:.3f} "
            f"| {chain * 1e3:.3f} | {flat / sdpa:.2f} | {sdpa / cascade:.2f} ({(sdpa - chain) / (cascade - chain):.2f}) "
            f"| {cascade / flat:.2f} ({(cascade - chain) / (flat - chain):.2f}) "
            f"| {r['sdpa_chained_s'] / r['cascade_chained_s']:.2f} | {'yes' if r['plan']['chosen'] else 'no'} "
            f"| {r['flat_bytes'] / flat / 1e12:.2f} | {r['cascade_bytes'] / cascade / 1e12:.2f} "
            f"| {r['cascade_floor_s'] * 1e3:.4f} | {r['flat_host_s'] * 1e3:.3f}, {r['cascade_host_s'] * 1e3:.3f} "
            f"| {r['sdpa_encode_s'] * 1e3:.3f}, {r['cascade_encode_s'] * 1e3:.3f} "
            f"| {r['sdpa_pipelined_s'] * 1e3:.3f}, {r['flat_pipelined_s'] * 1e3:.3f}, "
            f"{r['cascade_pipelined_s'] * 1e3:.3f} |")
    return "\n".join(lines)


def sweep_table(rows: list[dict]) -> str:
    lines = ["| S | B | level-0 warps | level-0 warps_m cap | level-0 pages | level-0 stages | cascade ms | IQR ms "
             "| vs flat |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['shared']} | {r['batch']} | {r['level0_warps']} | {r['level0_warps_m']} | {r['level0_pages']} "
              f"| {r['level0_stages']} "
              f"| {r['s'] * 1e3:.3f} "
              f"| {r['iqr_s'] * 1e3:.3f} | {r['vs_flat']:.1e} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shared", type=int_list, default=[2048, 8192, 32768])
    parser.add_argument("--batches", type=int_list, default=[4, 8, 32, 64])
    parser.add_argument("--tail", type=int, default=256)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--tolerance", type=float, default=2e-2, help="largest relative error between methods")
    parser.add_argument("--reference-limit", type=int, default=2048 * 8, help="float64 check where S*B <= this")
    parser.add_argument("--sweep", action="store_true",
                        help="also time level 0 against block warps, head-splitting warps, tile width and ring")
    parser.add_argument("--sweep-cells", type=lambda text: [tuple(int(n) for n in cell.split("x")) for cell in text.split(",")],
                        default=[(8192, 32), (8192, 64), (32768, 32), (2048, 64), (2048, 32)],
                        help="the sweep's cells, SHAREDxBATCH,...")
    parser.add_argument("--sweep-stages", type=int_list, default=[0],
                        help="level 0's staging rings the sweep times, e.g. 2,3,4 (0: the platform's)")
    parser.add_argument("--sweep-stages-only", action="store_true",
                        help="sweep tile width and staging ring over the heuristic's head layout only")
    parser.add_argument("--breakdown", action="store_true", help="also time each cascade launch alone")
    parser.add_argument("--kv-dtypes", action="store_true",
                        help="also time flat and cascade over bf16, int8 and int4 pages at --kv-cell")
    parser.add_argument("--kv-dtypes-only", action="store_true", help="only the --kv-dtypes arms (no cell grid)")
    parser.add_argument("--kv-cell", type=lambda text: tuple(int(n) for n in text.split("x")), default=(8192, 32),
                        help="the KV dtype arms' cell, SHAREDxBATCH")
    parser.add_argument("--copy-mib", type=int, default=1024, help="copy-bandwidth array size")
    parser.add_argument("--matmul-n", type=int, default=8192, help="matmul-rate size (n x n x n)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    info = {"mlx": mx.__version__, "device": device_name(), "default_device": str(mx.default_device()),
            "architecture": mx.device_info().get("architecture"), "kernels": backend_name()}
    bw, rate = copy_bandwidth(args.reps, args.copy_mib), matmul_rate(5, args.matmul_n)
    info.update(copy_bandwidth_Bps=bw, matmul_bf16_flops=rate)
    print(json.dumps(info), flush=True)
    results = []
    for shared in [] if args.kv_dtypes_only else args.shared:
        for batch in args.batches:
            r = run_cell(args, shared, batch, bw)
            results.append(r)
            print(json.dumps(r), flush=True)
    report = {"info": info, "cells": results}
    if args.kv_dtypes or args.kv_dtypes_only:
        report["kv_dtypes"] = kv_dtype_arms(args)
        print(json.dumps(report["kv_dtypes"]), flush=True)
    if args.sweep:
        report["level0_sweep"] = sweep_level0(args)
    if args.breakdown:
        report["cascade_breakdown"] = breakdown(args)
        print(json.dumps(report["cascade_breakdown"]), flush=True)
    (args.out / "attention_bench.json").write_text(json.dumps(report, indent=1))
    text = (f"copy bandwidth {bw / 1e12:.2f} TB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s, "
            f"{info['device']}, mlx {info['mlx']}, kernels {info['kernels']}\n\n" + table(results))
    if report.get("level0_sweep"):
        text += "\n\nlevel 0 sweep (None: the heuristic's choice)\n\n" + sweep_table(report["level0_sweep"])
    if report.get("kv_dtypes"):
        text += "\n\n" + kv_table(report["kv_dtypes"])
    (args.out / "attention_bench.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
