"""The flat launch's tile width across cells: which width a cell's bf16 and int8 pages run fastest at, to set the
width heuristic from (run 71 found 128-page tiles ahead of the heuristic's at 8K and 32K x 32, one tile a row
ahead at 8K and behind at 32K). At each cell the flat decode plan planned with MLXCEL_CHUNK_PAGES unset (the
heuristic) and at 64, 128, 256 and 1000 pages (one tile a row), over bf16 and int8 pages, all timed side by side
(measure_all), each checked against bf16 flat at the heuristic's width first. A cell's results are written as
soon as it is timed.

    python probe.py OUTDIR [SHAREDxBATCH ...]
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
TOLERANCE = 5e-2   # int8 pages against bf16 flat: the codes' rounding (relative error ~1e-2)
WIDTHS = (None, 64, 128, 256, 1000)


def arms_of(cell: Cell) -> tuple[dict, dict]:
    pools = {"bf16": (cell.k_pools, cell.v_pools),
             "int8": ([QuantizedPages(*quantize(k, FORMATS["int8"])) for k in cell.k_pools],
                      [QuantizedPages(*quantize(v, FORMATS["int8"])) for v in cell.v_pools])}
    mx.eval(pools["int8"])
    arms = {"chain": cell.chain_only}
    for dtype, (k_pools, v_pools) in pools.items():
        shape = replace(cell.shape, pool_dtype=k_pools[0].dtype)
        for pages in WIDTHS:
            if pages:
                os.environ[CHUNK_PAGES_ENV] = str(pages)
            with every_span_kept():
                plan = DecodePlan(cell.csr, OFF.snapshot(), shape)
            os.environ.pop(CHUNK_PAGES_ENV, None)

            def flat(i, dep=None, plan=plan, k_pools=k_pools, v_pools=v_pools):
                s = i % cell.sets
                return plan.attend(cell.query(i, dep), k_pools[s], v_pools[s], cell.csr.last_page_len)
            arms[f"{dtype} flat pages={pages or 'auto'}"] = flat
    want = cell.flat(0)
    checks = {name: relative_error(call(0), want) for name, call in arms.items() if name != "chain"}
    return arms, checks


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cells = [tuple(int(n) for n in c.split("x")) for c in sys.argv[2:]] or [
        (8192, 32), (32768, 32), (2048, 32), (8192, 64)]
    report, lines = {}, []
    for shared, batch in cells:
        cell = Cell(shared, TAIL, batch)
        arms, checks = arms_of(cell)
        bad = {k: v for k, v in checks.items() if v > TOLERANCE}
        if bad:
            raise SystemExit(f"{shared} x {batch}: arms disagree with bf16 flat: {bad}")
        timed = measure_all(arms, 9)
        report[f"{shared}x{batch}"] = {"checks": checks, "timed": timed}
        lines += [f"\n{shared} shared x {batch} (tail {TAIL})", "", "| arm | ms | IQR ms | vs bf16 flat |",
                  "|---|---|---|---|"]
        lines += [f"| {name} | {t['s'] * 1e3:.4f} | {t['iqr_s'] * 1e3:.4f} | {checks.get(name, 0):.1e} |"
                  for name, t in timed.items()]
        print("\n".join(lines[-len(timed) - 4:]), flush=True)
        (out / "probe.json").write_text(json.dumps(report, indent=1))
        (out / "probe.md").write_text("\n".join(lines) + "\n")
        del cell, arms
        mx.clear_cache()


if __name__ == "__main__":
    main()
