"""The flat launch's tiles a row: at 8192 x 32 the width heuristic's 128 pages cut a row's 258 into three tiles
of 86 (split_rows evens them out; 768 blocks on 396 block slots, three 4-warp blocks an SM by registers).
Here the heuristic's width against the widths that split the longest row into k even tiles (k = 3: the
heuristic's own plan again; k = 6), for bf16, int8 and int4 pages, timed side by side a cell (measure_all), each
checked against bf16 flat at the heuristic's width. (Written expecting the heuristic's tiles to be 128, 128 and
2 pages; they are not, so k = 3 reads the same plan twice.)

    python widths.py OUTDIR [SHAREDxBATCH ...]
"""

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from gpu_attention_bench import OFF, Cell, every_span_kept, measure_all, relative_error
from mlxcel.engine.decode_plan import DecodePlan
from mlxcel.kernels.kv_quant import FORMATS, QuantizedPages, quantize
from mlxcel.kernels.portable import CHUNK_PAGES_ENV

TAIL = 64
TOLERANCE = {"bf16": 1e-2, "int8": 5e-2, "int4": 2e-1}   # against bf16 flat: the merge's order; the codes' rounding
EVEN_TILES = (3, 6)


def arms_of(cell: Cell) -> tuple[dict, dict]:
    pools = {"bf16": (cell.k_pools, cell.v_pools)}
    for name in ("int8", "int4"):
        pools[name] = ([QuantizedPages(*quantize(k, FORMATS[name])) for k in cell.k_pools],
                       [QuantizedPages(*quantize(v, FORMATS[name])) for v in cell.v_pools])
        mx.eval(pools[name])
    longest = int(cell.host.num_pages().max())
    widths = (None, *(-(-longest // k) for k in EVEN_TILES))
    arms, checks = {}, {}
    want = cell.flat(0)
    for dtype, (k_pools, v_pools) in pools.items():
        shape = replace(cell.shape, pool_dtype=k_pools[0].dtype)
        for width in widths:
            if width:
                os.environ[CHUNK_PAGES_ENV] = str(width)
            with every_span_kept():
                plan = DecodePlan(cell.csr, OFF.snapshot(), shape)
            os.environ.pop(CHUNK_PAGES_ENV, None)

            def flat(i, dep=None, plan=plan, k_pools=k_pools, v_pools=v_pools):
                s = i % cell.sets
                return plan.attend(cell.query(i, dep), k_pools[s], v_pools[s], cell.csr.last_page_len)
            name = f"{dtype} flat pages={width or 'auto'}"
            arms[name] = flat
            checks[name] = relative_error(flat(0), want)
            if checks[name] > TOLERANCE[dtype]:
                raise SystemExit(f"{name}: {checks[name]:.2e} from bf16 flat")
    return arms, checks


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cells = [tuple(int(n) for n in c.split("x")) for c in sys.argv[2:]] or [(8192, 32), (32768, 32)]
    report, lines = {}, []
    for shared, batch in cells:
        cell = Cell(shared, TAIL, batch)
        arms, checks = arms_of(cell)
        timed = measure_all(arms, 9)
        report[f"{shared}x{batch}"] = {"checks": checks, "timed": timed}
        bf16 = timed["bf16 flat pages=auto"]["s"]
        lines += [f"\n{shared} shared x {batch} (tail {TAIL})", "",
                  "| arm | ms | IQR ms | bf16 auto / arm | check |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {t['s'] * 1e3:.4f} | {t['iqr_s'] * 1e3:.4f} | {bf16 / t['s']:.2f}x | "
                  f"{checks[name]:.1e} |" for name, t in timed.items()]
        print("\n".join(lines[-len(timed) - 4:]), flush=True)
        (out / "widths.json").write_text(json.dumps(report, indent=1))
        (out / "widths.md").write_text("\n".join(lines) + "\n")
        del cell, arms
        mx.clear_cache()


if __name__ == "__main__":
    main()
