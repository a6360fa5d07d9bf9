"""int8's stacked level with two producer warpgroups (git branch producers2): 256 threads stage and convert each
chunk where main's 128 do (run 87: the producer's conversion sets the level's pace at 32K). Against main's kernel
(main_cuda_warpgroup.py beside this file: main's kernels/cuda_warpgroup.py saved there) loaded in the same process,
launched with main's 384 threads a block. The same conversions and products: the two int8 arms must agree bit for
bit, each within the codes' rounding of bf16 flat. Writes OUT/faster when the branch is faster at 32K.

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
    spec = importlib.util.spec_from_file_location("main_cuda_warpgroup", Path(__file__).parent /
                                                  "main_cuda_warpgroup.py")
    main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main)
    library = cuda.KERNELS.platform.header
    assert library.count(cuda_warpgroup.WARPGROUP_PARTIAL_SOURCE) == 1
    return fused.FusedKernels(replace(cuda.KERNELS.platform, header=library.replace(
        cuda_warpgroup.WARPGROUP_PARTIAL_SOURCE, main.WARPGROUP_PARTIAL_SOURCE)))


def main_launches(step) -> None:
    """Main's kernel on the branch's launches: blocks of 8 warps and one producer warpgroup, not two."""
    for level in step.levels:
        options = level.launch.options
        if options["threadgroup"][0] == 512:
            options["grid"] = (options["grid"][0] // 512 * 384, *options["grid"][1:])
            options["threadgroup"] = (384, 1, 1)


def arms_of(cell: Cell, before: fused.FusedKernels) -> tuple[dict, dict]:
    pools = {"bf16": (cell.k_pools, cell.v_pools),
             "int8": ([QuantizedPages(*quantize(k, FORMATS["int8"])) for k in cell.k_pools],
                      [QuantizedPages(*quantize(v, FORMATS["int8"])) for v in cell.v_pools])}
    mx.eval(pools["int8"])
    _, layout, private = cell.cascade_views
    arms = {"chain": cell.chain_only}
    for dtype, (k_pools, v_pools) in pools.items():
        shape = replace(cell.shape, pool_dtype=k_pools[0].dtype)
        for name, kernels in (("main", before), ("producers2", cuda.KERNELS)):
            if dtype == "bf16" and name == "producers2":
                continue      # 16-bit pages run the same code on both
            step = kernels.prepare_cascade(shape, cell.batch, private, layout.kernel_levels)
            if kernels is before:
                main_launches(step)

            def call(i, dep=None, step=step, k_pools=k_pools, v_pools=v_pools):
                s = i % cell.sets
                return step(cell.query(i, dep), k_pools[s], v_pools[s], private.last_page_len)
            arms[f"{dtype} cascade, {name}"] = call
    want = cell.flat(0)
    checks = {name: relative_error(call(0), want) for name, call in arms.items() if name != "chain"}
    same = mx.array_equal(arms["int8 cascade, main"](0), arms["int8 cascade, producers2"](0)).item()
    return arms, {**checks, "int8 main == producers2": same}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cells = [tuple(int(n) for n in c.split("x")) for c in sys.argv[2:]] or [(8192, 32), (32768, 32)]
    before = main_kernels()
    report, lines = {}, []
    for shared, batch in cells:
        cell = Cell(shared, TAIL, batch)
        arms, checks = arms_of(cell, before)
        bad = {k: v for k, v in checks.items() if v is not True and not (isinstance(v, float) and v <= TOLERANCE)}
        if bad:
            raise SystemExit(f"{shared} x {batch}: arms disagree: {bad}")
        timed = measure_all(arms, 11)
        report[f"{shared}x{batch}"] = {"checks": checks, "timed": timed}
        lines += [f"\n{shared} shared x {batch} (tail {TAIL})", "", "| arm | ms | IQR ms | vs bf16 flat |",
                  "|---|---|---|---|"]
        lines += [f"| {name} | {t['s'] * 1e3:.4f} | {t['iqr_s'] * 1e3:.4f} | {checks.get(name, 0):.1e} |"
                  for name, t in timed.items()]
        print("\n".join(lines[-len(timed) - 4:]), flush=True)
    (out / "probe.json").write_text(json.dumps(report, indent=1))
    last = report[f"{cells[-1][0]}x{cells[-1][1]}"]["timed"]
    if last["int8 cascade, producers2"]["s"] < last["int8 cascade, main"]["s"]:
        (out / "faster").write_text("")
    (out / "probe.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
