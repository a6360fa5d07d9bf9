"""The flat launch's staging ring for 16-bit and quantized pages: int8 and int4 flat take the same time on an
H100 and an H200 (0.16 ms at 8K x 32) though their bytes and conversions differ, so neither bytes nor the
conversion's instructions alone set it. Here bf16, int8 and int4 flat at the heuristic's width on rings of 2
(main), 3 and 4 chunks, timed side by side a cell (measure_all), each checked first against its dtype's ring
of 2 (the same sums, so bit for bit) and that against bf16 flat (the codes' rounding). ``--once``: one call of
each ring-of-2 arm and nothing timed (for Nsight Compute).

    python probe.py OUTDIR [--once] [SHAREDxBATCH ...]
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
RINGS = (2, 3, 4)


def arms_of(cell: Cell, rings) -> tuple[dict, dict]:
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
        for ring in rings:
            cuda.KERNELS.platform = replace(platform, stages=ring)
            with every_span_kept():
                plan = DecodePlan(cell.csr, OFF.snapshot(), shape)
            cuda.KERNELS.platform = platform

            def flat(i, dep=None, plan=plan, k_pools=k_pools, v_pools=v_pools):
                s = i % cell.sets
                return plan.attend(cell.query(i, dep), k_pools[s], v_pools[s], cell.csr.last_page_len)
            name = f"{dtype} flat ring={ring}"
            arms[name] = flat
            got = flat(0)
            if ring == rings[0]:
                base = got
                checks[name] = relative_error(got, want)
                if checks[name] > TOLERANCE[dtype]:
                    raise SystemExit(f"{name}: {checks[name]:.2e} from bf16 flat")
            else:
                checks[name] = relative_error(got, base)
                if checks[name] > 0:
                    raise SystemExit(f"{name}: {checks[name]:.2e} from its ring of {rings[0]}")
    return arms, checks


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    once = "--once" in sys.argv
    cells = [tuple(int(n) for n in c.split("x")) for c in sys.argv[2:] if c != "--once"] or [(8192, 32), (32768, 32)]
    report, lines = {}, []
    for shared, batch in cells:
        cell = Cell(shared, TAIL, batch)
        arms, checks = arms_of(cell, RINGS[:1] if once else RINGS)
        print(f"{shared}x{batch} checks: {checks}", flush=True)
        if once:
            continue
        timed = measure_all(arms, 9)
        report[f"{shared}x{batch}"] = {"checks": checks, "timed": timed}
        bf16 = timed["bf16 flat ring=2"]["s"]
        lines += [f"\n{shared} shared x {batch} (tail {TAIL})", "",
                  "| arm | ms | IQR ms | bf16 ring 2 / arm | check |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {t['s'] * 1e3:.4f} | {t['iqr_s'] * 1e3:.4f} | {bf16 / t['s']:.2f}x | "
                  f"{checks[name]:.1e} |" for name, t in timed.items()]
        print("\n".join(lines[-len(timed) - 4:]), flush=True)
        (out / "probe.json").write_text(json.dumps(report, indent=1))
        (out / "probe.md").write_text("\n".join(lines) + "\n")
        del cell, arms
        mx.clear_cache()


if __name__ == "__main__":
    main()
