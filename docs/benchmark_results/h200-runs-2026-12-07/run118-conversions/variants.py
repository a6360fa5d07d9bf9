"""int8 flat's partial kernel as main has it and as each of run 118's changes leaves it, in one process (each
kernels/cuda_<name>.py imported beside the others, with its own library and kernel names; run.sh copies them
there): main, copies (a stage's copies from page bases), vscale (+ value scales on the weights), kbias
(copies + the scores' codes biased, no value scales on the weights), the branch (all three), and main and the
branch staging chunks of 128 tokens (main128, branch128: the platform's 64 in the module's copy). Each arm's
states checked against main's within float16 rounding, then all timed side by side (measure_all).

    python variants.py OUTDIR [NAME=MODULE ...]   (other arms: main's against kernels/MODULE.py's)
"""

import importlib
import json
import sys
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from gpu_attention_bench import Cell, measure_all
from mlxcel.kernels.kv_quant import FORMATS, QuantizedPages, quantize

TAIL = 64
VARIANTS = {"main": "cuda_main", "copies": "cuda_copies", "vscale": "cuda_vscale", "kbias": "cuda_kbias",
            "branch": "cuda", "main128": "cuda_main128", "branch128": "cuda_branch128"}


def arms_of(cell: Cell, variants: dict) -> dict:
    k_pools = [QuantizedPages(*quantize(k, FORMATS["int8"])) for k in cell.k_pools]
    v_pools = [QuantizedPages(*quantize(v, FORMATS["int8"])) for v in cell.v_pools]
    mx.eval(k_pools, v_pools)
    shape = replace(cell.shape, pool_dtype=k_pools[0].dtype)
    arms, states = {}, {}
    for name, module in variants.items():
        launch = importlib.import_module(f"mlxcel.kernels.{module}").KERNELS.prepare_partial(cell.csr, shape)

        def partial(i, dep=None, launch=launch):
            s = i % cell.sets
            return launch(cell.query(i, dep), k_pools[s], v_pools[s], cell.csr.last_page_len)[0]
        arms[f"int8 flat {name}"] = partial
        states[name] = launch(cell.query(0, None), k_pools[0], v_pools[0], cell.csr.last_page_len)
        mx.eval(states[name])
        (o_main, lse_main), (o, lse) = states["main"], states[name]
        o_error = (mx.linalg.norm(o - o_main) / mx.linalg.norm(o_main)).item()
        lse_error = mx.abs(lse - lse_main).max().item()
        print(f"{name}: o relative difference {o_error:.2e}, lse largest difference {lse_error:.2e}", flush=True)
        if not (o_error < 3e-3 and lse_error < 3e-3):
            raise SystemExit(f"{name}: its states are further from main's than float16 rounding")
    return arms


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    variants = dict(arg.split("=") for arg in sys.argv[2:])
    variants = {"main": "cuda_main", **variants} if variants else VARIANTS
    report, lines = {}, []
    for shared, batch in [(8192, 32), (32768, 32)]:
        cell = Cell(shared, TAIL, batch)
        timed = measure_all(arms_of(cell, variants), 11)
        report[f"{shared}x{batch}"] = timed
        lines += [f"\n{shared} shared x {batch} (tail {TAIL}; partial launch only)", "",
                  "| arm | ms | IQR ms | main / arm |", "|---|---|---|---|"]
        for name, t in timed.items():
            ratio = timed["int8 flat main"]["s"] / t["s"]
            lines.append(f"| {name} | {t['s'] * 1e3:.4f} | {t['iqr_s'] * 1e3:.4f} | {ratio:.3f}x |")
        print("\n".join(lines[-len(timed) - 4:]), flush=True)
        (out / "variants.json").write_text(json.dumps(report, indent=1))
        (out / "variants.md").write_text("\n".join(lines) + "\n")
        del cell
        mx.clear_cache()


if __name__ == "__main__":
    main()
