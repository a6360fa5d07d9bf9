"""Main's flat partial kernels against this branch's (a quantized stage's copies from page bases; int8: value
scales on the weights, the scores' codes biased), in one process: main's kernels/cuda.py is imported beside the
branch's as kernels/cuda_main.py (run.sh copies main_cuda.py there), each with its own library and kernel names.
At each cell bf16, int8 and int4 pages: bf16's and int4's states (o, lse) checked bit for bit against main's (only
the copies' instructions differ), int8's within float16 rounding of main's (its operands round otherwise: the
relative error of o and the largest lse difference are printed), then all timed side by side (measure_all).
ROUNDED names the pools checked within rounding (run 119's ab.py adds int4).

    python ab.py OUTDIR [SHAREDxBATCH ...]
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from gpu_attention_bench import Cell, measure_all
from mlxcel.kernels import cuda, cuda_main
from mlxcel.kernels.kv_quant import FORMATS, QuantizedPages, quantize

TAIL = 64
ROUNDED = ("int8",)        # pools whose states are checked within float16 rounding; the others bit for bit


def arms_of(cell: Cell) -> dict:
    pools = {"bf16": (cell.k_pools, cell.v_pools)}
    for name in ("int8", "int4"):
        pools[name] = ([QuantizedPages(*quantize(k, FORMATS[name])) for k in cell.k_pools],
                       [QuantizedPages(*quantize(v, FORMATS[name])) for v in cell.v_pools])
        mx.eval(pools[name])
    arms = {}
    for dtype, (k_pools, v_pools) in pools.items():
        shape = replace(cell.shape, pool_dtype=k_pools[0].dtype)
        outputs = {}
        for impl, module in (("main", cuda_main), ("branch", cuda)):
            launch = module.KERNELS.prepare_partial(cell.csr, shape)

            def partial(i, dep=None, launch=launch, k_pools=k_pools, v_pools=v_pools):
                s = i % cell.sets
                return launch(cell.query(i, dep), k_pools[s], v_pools[s], cell.csr.last_page_len)[0]
            arms[f"{dtype} flat {impl}"] = partial
            s = 0
            outputs[impl] = launch(cell.query(0, None), k_pools[s], v_pools[s], cell.csr.last_page_len)
            mx.eval(outputs[impl])
        (o_main, lse_main), (o_branch, lse_branch) = outputs["main"], outputs["branch"]
        if dtype in ROUNDED:
            o_error = (mx.linalg.norm(o_branch - o_main) / mx.linalg.norm(o_main)).item()
            lse_error = mx.abs(lse_branch - lse_main).max().item()
            print(f"{dtype}: o relative difference {o_error:.2e}, lse largest difference {lse_error:.2e}", flush=True)
            if not (o_error < 3e-3 and lse_error < 3e-3):
                raise SystemExit(f"{dtype}: the branch's states are further from main's than float16 rounding")
        elif not all(mx.array_equal(w, g, equal_nan=True).item() for w, g in zip(outputs["main"], outputs["branch"])):
            raise SystemExit(f"{dtype}: the branch's states differ from main's")
    return arms


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cells = [tuple(int(n) for n in c.split("x")) for c in sys.argv[2:]] or [(8192, 32), (32768, 32)]
    report, lines = {}, []
    for shared, batch in cells:
        cell = Cell(shared, TAIL, batch)
        arms = arms_of(cell)
        print(f"{shared}x{batch}: {', '.join(ROUNDED)} within rounding of main's, the others bit for bit", flush=True)
        timed = measure_all(arms, 11)
        report[f"{shared}x{batch}"] = timed
        lines += [f"\n{shared} shared x {batch} (tail {TAIL}; partial launch only)", "",
                  "| arm | ms | IQR ms | main / branch |", "|---|---|---|---|"]
        for name, t in timed.items():
            ratio = timed[name.replace("branch", "main")]["s"] / t["s"] if "branch" in name else 1.0
            lines.append(f"| {name} | {t['s'] * 1e3:.4f} | {t['iqr_s'] * 1e3:.4f} | {ratio:.3f}x |")
        print("\n".join(lines[-len(timed) - 4:]), flush=True)
        (out / "ab.json").write_text(json.dumps(report, indent=1))
        (out / "ab.md").write_text("\n".join(lines) + "\n")
        del cell, arms
        mx.clear_cache()


if __name__ == "__main__":
    main()
