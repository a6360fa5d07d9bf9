"""The flat launch's occupancy: Nsight Compute (run.sh ncu) has the flat kernels at 155-168 registers a thread,
three 4-warp blocks an SM by registers (18.75% occupancy), int8's issue slots 56% busy with 0.93 eligible warps
a scheduler: latency-bound. Here the ring-of-2 kernels compiled with __launch_bounds__(128, B) for B = 4 and 5
(at most 128 and 102 registers), against the kernels as on main, for bf16, int8 and int4 pages, timed side by
side a cell (measure_all), each checked against its dtype's kernel as on main (bit for bit expected: the same
instructions' results, only the registers differ) and that against bf16 flat.

    python bounds.py OUTDIR [--once] [SHAREDxBATCH ...]   (--once: the checks' calls only, for Nsight Compute)
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from gpu_attention_bench import OFF, Cell, every_span_kept, measure_all, relative_error
from mlxcel.engine.decode_plan import DecodePlan
from mlxcel.kernels import cuda
from mlxcel.kernels.kv_quant import FORMATS, QuantizedPages, quantize

TAIL = 64
TOLERANCE = {"bf16": 0.0, "int8": 5e-2, "int4": 2e-1}   # against bf16 flat: the codes' rounding
BOUNDS = (None, 4, 5)


def bounded(blocks: int | None):
    """The platform's kernel factory, the flat partial kernels (128 threads) compiled for ``blocks`` an SM."""
    if blocks is None:
        return cuda.make_kernel

    def make(name, inputs, outputs, source, header, shared):
        if "partial" not in name or "warpgroup" in name:
            return cuda.make_kernel(name, inputs, outputs, source, header, shared)
        bounds = (f"#undef __global__\n#define __global__ __location__(global) __launch_bounds__(128, {blocks})\n")
        return mx.fast.cuda_kernel(name=f"{name}_b{blocks}", input_names=inputs, output_names=outputs,
                                   source=source, header=f'#include "{cuda.library_file(header)}"\n' + bounds,
                                   shared_memory=shared)
    return make


def arms_of(cell: Cell) -> tuple[dict, dict]:
    pools = {"bf16": (cell.k_pools, cell.v_pools)}
    for name in ("int8", "int4"):
        pools[name] = ([QuantizedPages(*quantize(k, FORMATS[name])) for k in cell.k_pools],
                       [QuantizedPages(*quantize(v, FORMATS[name])) for v in cell.v_pools])
        mx.eval(pools[name])
    platform = cuda.KERNELS.platform
    arms, checks = {}, {}
    want = cell.flat(0)
    for dtype, (k_pools, v_pools) in pools.items():
        shape = replace(cell.shape, pool_dtype=k_pools[0].dtype)
        for blocks in BOUNDS:
            cuda.KERNELS.platform = replace(platform, make_kernel=bounded(blocks))
            cuda.KERNELS._kernels.clear()
            with every_span_kept():
                plan = DecodePlan(cell.csr, OFF.snapshot(), shape)
            cuda.KERNELS.platform = platform
            cuda.KERNELS._kernels.clear()

            def flat(i, dep=None, plan=plan, k_pools=k_pools, v_pools=v_pools):
                s = i % cell.sets
                return plan.attend(cell.query(i, dep), k_pools[s], v_pools[s], cell.csr.last_page_len)
            name = f"{dtype} flat bounds={blocks or 'main'}"
            arms[name] = flat
            got = flat(0)
            if blocks is None:
                base = got
                checks[name] = relative_error(got, want)
                if checks[name] > TOLERANCE[dtype]:
                    raise SystemExit(f"{name}: {checks[name]:.2e} from bf16 flat")
            else:
                checks[name] = relative_error(got, base)
                if checks[name] > 0:
                    raise SystemExit(f"{name}: {checks[name]:.2e} from the kernel as on main")
    return arms, checks


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    once = "--once" in sys.argv
    cells = [tuple(int(n) for n in c.split("x")) for c in sys.argv[2:] if c != "--once"] or [(8192, 32), (32768, 32)]
    report, lines = {}, []
    for shared, batch in cells:
        cell = Cell(shared, TAIL, batch)
        arms, checks = arms_of(cell)
        print(f"{shared}x{batch} checks: {checks}", flush=True)
        if once:
            continue
        timed = measure_all(arms, 9)
        report[f"{shared}x{batch}"] = {"checks": checks, "timed": timed}
        bf16 = timed["bf16 flat bounds=main"]["s"]
        lines += [f"\n{shared} shared x {batch} (tail {TAIL})", "",
                  "| arm | ms | IQR ms | bf16 main / arm | check |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {t['s'] * 1e3:.4f} | {t['iqr_s'] * 1e3:.4f} | {bf16 / t['s']:.2f}x | "
                  f"{checks[name]:.1e} |" for name, t in timed.items()]
        print("\n".join(lines[-len(timed) - 4:]), flush=True)
        (out / "bounds.json").write_text(json.dumps(report, indent=1))
        (out / "bounds.md").write_text("\n".join(lines) + "\n")
        del cell, arms
        mx.clear_cache()


if __name__ == "__main__":
    main()
