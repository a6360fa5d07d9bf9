"""Blocks of two warpgroups in ping-pong (pingpong.patch, applied to main at 5f9d251): the second warpgroup issues
each product after the first's, so the first's finish first and its softmax runs under the second's products
(FlashAttention-3), against main's kernel (main_cuda_warpgroup.py, main's kernels/cuda_warpgroup.py beside it)
loaded in the same process. Main's two-warpgroup blocks run each chunk's phases in lockstep (both warpgroups' S
products together, then both softmaxes on an idle tensor core, then both O += P V). The fused cascade step at each
cell: bf16 pages on one warpgroup a block (shipped; the same code on both kernels) and on two, int8 pages on two
(shipped) with a ring of three chunks and of four. Arms of one block shape must agree bit for bit (the same
products in another order of issue), each within the codes' rounding of bf16 flat.

    python probe.py OUTDIR [SHAREDxBATCH ...]
"""

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from gpu_attention_bench import Cell, measure_all, relative_error
from mlxcel.kernels import cuda, cuda_warpgroup, fused
from mlxcel.kernels.kv_quant import FORMATS, QuantizedPages, quantize

TAIL = 256
TOLERANCE = 5e-2   # int8 pages against bf16 flat: the codes' rounding (relative error ~1e-2)


def main_kernels() -> fused.FusedKernels:
    """The CUDA kernels with main's warpgroup kernel in their library."""
    spec = importlib.util.spec_from_file_location("main_cuda_warpgroup", Path(__file__).with_name(
        "main_cuda_warpgroup.py"))
    main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main)
    library = cuda.KERNELS.platform.header
    assert library.count(cuda_warpgroup.WARPGROUP_PARTIAL_SOURCE) == 1
    header = library.replace(cuda_warpgroup.WARPGROUP_PARTIAL_SOURCE, main.WARPGROUP_PARTIAL_SOURCE)
    return fused.FusedKernels(replace(cuda.KERNELS.platform, header=header))


def prepared(kernels, cell, shape, private, layout, blocks):
    """prepare_cascade with the pages' format's warpgroup block set to ``blocks`` (warpgroups, ring)."""
    key = shape.kv_quant and shape.kv_quant.name
    shipped = fused.WARPGROUP_BLOCKS[key]
    fused.WARPGROUP_BLOCKS[key] = blocks
    try:
        return kernels.prepare_cascade(shape, cell.batch, private, layout.kernel_levels)
    finally:
        fused.WARPGROUP_BLOCKS[key] = shipped


def arms_of(cell: Cell, before: fused.FusedKernels) -> tuple[dict, dict]:
    pools = {"bf16": (cell.k_pools, cell.v_pools),
             "int8": ([QuantizedPages(*quantize(k, FORMATS["int8"])) for k in cell.k_pools],
                      [QuantizedPages(*quantize(v, FORMATS["int8"])) for v in cell.v_pools])}
    mx.eval(pools["int8"])
    _, layout, private = cell.cascade_views
    plan = [("bf16", "1 wg", before, (1, None)), ("bf16", "2 wg, main", before, (2, None)),
            ("bf16", "2 wg, ping-pong", cuda.KERNELS, (2, None)), ("int8", "2 wg, main", before, (2, 3)),
            ("int8", "2 wg, ping-pong", cuda.KERNELS, (2, 3)),
            ("int8", "2 wg, ping-pong, ring 4", cuda.KERNELS, (2, 4))]
    arms = {"chain": cell.chain_only}
    for dtype, name, kernels, blocks in plan:
        k_pools, v_pools = pools[dtype]
        step = prepared(kernels, cell, replace(cell.shape, pool_dtype=k_pools[0].dtype), private, layout, blocks)

        def call(i, dep=None, step=step, k_pools=k_pools, v_pools=v_pools):
            s = i % cell.sets
            return step(cell.query(i, dep), k_pools[s], v_pools[s], private.last_page_len)
        arms[f"{dtype} cascade, {name}"] = call
    want = cell.flat(0)
    checks = {name: relative_error(call(0), want) for name, call in arms.items() if name != "chain"}
    for dtype, ring in (("bf16", ""), ("int8", ""), ("int8", ", ring 4")):
        pingpong = arms[f"{dtype} cascade, 2 wg, ping-pong{ring}"](0)
        same = mx.array_equal(arms[f"{dtype} cascade, 2 wg, main"](0), pingpong)
        checks[f"{dtype} main == ping-pong{ring}"] = same.item()
    return arms, checks


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cells = [tuple(int(n) for n in c.split("x")) for c in sys.argv[2:]] or [(8192, 32), (32768, 32)]
    before = main_kernels()
    report, lines = {}, []
    for shared, batch in cells:
        cell = Cell(shared, TAIL, batch)
        arms, checks = arms_of(cell, before)
        print(checks, flush=True)
        bad = {k: v for k, v in checks.items() if v is not True and not (isinstance(v, float) and v <= TOLERANCE)}
        if bad:
            raise SystemExit(f"{shared} x {batch}: arms disagree: {bad}")
        timed = measure_all(arms, 11)
        report[f"{shared}x{batch}"] = {"checks": checks, "timed": timed}
        lines += [f"\n{shared} shared x {batch} (tail {TAIL})", "", "| arm | ms | IQR ms | vs bf16 flat |",
                  "|---|---|---|---|"]
        lines += [f"| {name} | {t['s'] * 1e3:.4f} | {t['iqr_s'] * 1e3:.4f} | {checks.get(name, 0):.1e} |"
                  for name, t in timed.items()]
    (out / "probe.json").write_text(json.dumps(report, indent=1))
    (out / "probe.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
