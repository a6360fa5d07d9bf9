"""int8 level 0 on blocks of two warpgroups. Run 71's ncu (32768 x 32, H100): the int8 warpgroup level executes
2.2x the bf16 level's instructions (31.6M against 14.6M), its DRAM 20% busy: it is bound by issuing them, and
most of the extra are a chunk's staging and its conversion into float16 operands, done once a block. Blocks
of one warpgroup (64 heads) stage and convert every chunk once for each of the level's head groups (128 heads at
32 rows: twice); a block of two does it once. The fused cascade step at each cell over bf16 and int8 pages,
the format's WARPGROUPS_PER_BLOCK 1 or 2 (and int8's ring of three), timed side by side, each checked against
bf16 flat.

    python probe.py OUTDIR [SHAREDxBATCH ...]
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from gpu_attention_bench import Cell, measure_all, relative_error
from mlxcel.kernels import backend, fused
from mlxcel.kernels.kv_quant import FORMATS, QuantizedPages, quantize

TAIL = 256
TOLERANCE = 5e-2   # int8 pages against bf16 flat: the codes' rounding (relative error ~1e-2)


def arms_of(cell: Cell) -> tuple[dict, dict]:
    pools = {"bf16": (cell.k_pools, cell.v_pools),
             "int8": ([QuantizedPages(*quantize(k, FORMATS["int8"])) for k in cell.k_pools],
                      [QuantizedPages(*quantize(v, FORMATS["int8"])) for v in cell.v_pools])}
    mx.eval(pools["int8"])
    _, layout, private = cell.cascade_views
    arms = {"chain": cell.chain_only}
    for dtype, (k_pools, v_pools) in pools.items():
        shape = replace(cell.shape, pool_dtype=k_pools[0].dtype)
        for per_block, stages in ((1, None), (2, None), (2, 3)):
            if dtype == "bf16" and stages:
                continue
            key = None if dtype == "bf16" else "int8"
            shipped = fused.WARPGROUPS_PER_BLOCK[key]
            fused.WARPGROUPS_PER_BLOCK[key] = per_block     # read when the launches are planned
            step = backend().KERNELS.prepare_cascade(shape, cell.batch, private, layout.kernel_levels, None,
                                                     None, None, stages)
            fused.WARPGROUPS_PER_BLOCK[key] = shipped
            warps = step.levels[0].launch.options["threadgroup"][0] // 32

            def call(i, dep=None, step=step, k_pools=k_pools, v_pools=v_pools):
                s = i % cell.sets
                return step(cell.query(i, dep), k_pools[s], v_pools[s], private.last_page_len)
            arms[f"{dtype} cascade, {per_block} warpgroups a block ({warps} warps), stages {stages or 'auto'}"] = call
    want = cell.flat(0)
    checks = {name: relative_error(call(0), want) for name, call in arms.items() if name != "chain"}
    return arms, checks


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cells = [tuple(int(n) for n in c.split("x")) for c in sys.argv[2:]] or [(8192, 32), (32768, 32)]
    report, lines = {}, []
    for shared, batch in cells:
        cell = Cell(shared, TAIL, batch)
        arms, checks = arms_of(cell)
        bad = {k: v for k, v in checks.items() if v > TOLERANCE}
        if bad:
            raise SystemExit(f"{shared} x {batch}: arms disagree with bf16 flat: {bad}")
        timed = measure_all(arms, 11)
        report[f"{shared}x{batch}"] = {"checks": checks, "timed": timed}
        lines += [f"\n{shared} shared x {batch} (tail {TAIL})", "", "| arm | ms | IQR ms | vs bf16 flat |",
                  "|---|---|---|---|"]
        lines += [f"| {name} | {t['s'] * 1e3:.4f} | {t['iqr_s'] * 1e3:.4f} | {checks.get(name, 0):.1e} |"
                  for name, t in timed.items()]
        print("\n".join(lines[-len(timed) - 4:]), flush=True)
    (out / "probe.json").write_text(json.dumps(report, indent=1))
    (out / "probe.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
