"""int8's stacked level (cascade level 0) against bf16's, and changes to int8's, in one process: the fused cascade
step and its level 0 alone, at 32768 and 8192 shared x 32 (tail 64, near the end-to-end cell's rows), and 32768 x
16 (64 stacked heads: blocks of one warpgroup).

Arms (each a cascade step; "level 0" arms the stacked launch alone; the variants' edits in variants.py):
- bf16, main; int8, main (a ring of 3 chunks, two operand pairs: the producers convert one chunk ahead);
- int8 ring4: main's kernel on a ring of 4 (one more chunk in flight);
- int8 pairs3: three operand pairs, the producers convert up to two chunks ahead of the consumers;
- int8 rows: the conversion's threads mapped so that a phase of 8 stores one piece of 8 rows (distinct bank
  groups under the swizzle), not 4 pieces of 2 column blocks of one row (8192 bytes apart: the same banks, a
  2-way conflict on every float16 store); rows pairs3: both;
- int8 late: the producers issue a chunk's refill after its conversion's fence and hand-over, not before: the
  fence compiles to MEMBAR.ALL.CTA, which might wait for the thread's copies in flight (then main's producers
  would wait each chunk for the copies they just issued; run 85's ncu read of the one-producer kernel counted no
  membar stalls, so unlikely: this arm settles it); late rows pairs3: with both;
- int8 late1: late, and blocks of one warpgroup (64 heads or fewer, no producers) convert a chunk before its
  refill, without the fence after the copies land (their codes are read by the conversion).
Two pool sets a cell, alternated, so no call reads pages the last left in L2 (as the engine's layers do). Every
int8 arm must equal int8 main bit for bit (the same products, the chunks handed over in another order or by other
threads), and int8 main be within the codes' rounding of bf16 flat.

    python probe.py OUTDIR [SHAREDxBATCH ...]
"""

import json
import sys
import types
from dataclasses import fields, replace
from pathlib import Path

import mlx.core as mx

from gpu_attention_bench import BLOCK, DTYPE, HKV, D, Cell, depend, measure_all, relative_error
from mlxcel.kernels import cuda, cuda_warpgroup, fused
from mlxcel.kernels.kv_quant import FORMATS, QuantizedPages, quantize

sys.path.insert(0, str(Path(__file__).parent))
import variants  # noqa: E402  (run 123's edits to main's level-0 kernel, beside this file)

TAIL = 64
SETS = 2
TOLERANCE = 5e-2   # int8 pages against bf16 flat: the codes' rounding (relative error ~1e-2)


# arm: (its variant in variants.py, None: main's kernel; its ring of chunks, None: main's)
INT8_ARMS = {"main": (None, None), "ring4": (None, 4), "pairs3": ("pairs3", None), "rows": ("rows", None),
             "rows pairs3": ("rows_pairs3", None), "rows pairs3 ring4": ("rows_pairs3", 4), "late": ("late", None),
             "late rows pairs3": ("late_rows_pairs3", None), "late1": ("late1", None)}
LEVEL0_ARMS = ("main", "rows pairs3", "late", "late rows pairs3", "late1")


class Pairs3Platform(fused.Platform):
    """The CUDA platform with a third operand pair in producer blocks' shared memory."""

    def warpgroup_staging_bytes(self, head_dim, warps, stages=None, quant=None):
        extra = 2 * self.chunk_tokens * head_dim * 2 if quant is not None and fused.has_producer(warps, quant) else 0
        return super().warpgroup_staging_bytes(head_dim, warps, stages, quant) + extra


def variant_kernels(name: str) -> fused.FusedKernels:
    """The CUDA kernels with variant NAME's level-0 kernel (variants.py) in their library."""
    module = types.ModuleType(f"{name}_cuda_warpgroup")
    exec(compile(variants.source(name), module.__name__, "exec"), module.__dict__)
    p = cuda.KERNELS.platform
    assert p.header.count(cuda_warpgroup.WARPGROUP_PARTIAL_SOURCE) == 1
    values = {f.name: getattr(p, f.name) for f in fields(p)}
    values["header"] = p.header.replace(cuda_warpgroup.WARPGROUP_PARTIAL_SOURCE, module.WARPGROUP_PARTIAL_SOURCE)
    return fused.FusedKernels((Pairs3Platform if "pairs3" in name else fused.Platform)(**values))


def pool_sets(cell: Cell) -> dict:
    """bf16 and int8 pools, SETS of each (set 0 the cell's own)."""
    k, v = [cell.k_pools[0]], [cell.v_pools[0]]
    for _ in range(SETS - 1):
        k.append(mx.random.normal(k[0].shape).astype(DTYPE))
        v.append(mx.random.normal(v[0].shape).astype(DTYPE))
    int8 = FORMATS["int8"]
    pools = {"bf16": (k, v), "int8": ([QuantizedPages(*quantize(x, int8)) for x in k],
                                      [QuantizedPages(*quantize(x, int8)) for x in v])}
    mx.eval(pools)
    return pools


def arms_of(cell: Cell, kernels_of: dict) -> tuple[dict, dict]:
    pools = pool_sets(cell)
    _, layout, private = cell.cascade_views
    queries = [cell.queries[0]] + [mx.random.normal(cell.queries[0].shape).astype(DTYPE) for _ in range(SETS - 1)]
    mx.eval(queries)

    def q_of(i, dep):
        q = queries[i % SETS]
        return q if dep is None else depend(q, dep)
    plans = [("bf16", "main", cuda.KERNELS, None)] + [
        ("int8", name, kernels_of[module] if module else cuda.KERNELS, stages)
        for name, (module, stages) in INT8_ARMS.items()]
    arms = {}
    for dtype, name, kernels, stages in plans:
        k_pools, v_pools = pools[dtype]
        shape = replace(cell.shape, pool_dtype=k_pools[0].dtype)
        step = kernels.prepare_cascade(shape, cell.batch, private, layout.kernel_levels, level0_stages=stages)

        def call(i, dep=None, step=step, k_pools=k_pools, v_pools=v_pools):
            return step(q_of(i, dep), k_pools[i % SETS], v_pools[i % SETS], private.last_page_len)
        arms[f"{dtype} cascade, {name}"] = call
        if name in LEVEL0_ARMS and not (dtype == "bf16" and name != "main"):
            level = step.levels[0]

            def level0(i, dep=None, level=level, kernels=kernels, k_pools=k_pools, v_pools=v_pools):
                return kernels.run_partial(level.launch, q_of(i, dep), k_pools[i % SETS], v_pools[i % SETS],
                                           level.view.indices, level.view.last_page_len, level.geometry,
                                           level.members)[0]
            arms[f"{dtype} level 0, {name}"] = level0
    want = cell.flat(0)
    checks = {name: relative_error(call(0), want) for name, call in arms.items() if "cascade" in name}
    reference = arms["int8 cascade, main"](0)
    for name, call in arms.items():
        if name.startswith("int8 cascade") and name != "int8 cascade, main":
            checks[f"{name} == main"] = mx.array_equal(call(0), reference).item()
    for name in LEVEL0_ARMS[1:]:
        checks[f"int8 level 0, {name} == main"] = mx.array_equal(arms[f"int8 level 0, {name}"](0),
                                                                 arms["int8 level 0, main"](0)).item()
    return arms, checks


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    once = "--once" in sys.argv
    cells = ([tuple(int(n) for n in c.split("x")) for c in sys.argv[2:] if "x" in c]
             or [(32768, 32), (8192, 32), (32768, 16)])
    kernels_of = {module: variant_kernels(module) for module, _ in INT8_ARMS.values() if module}
    report, lines = {}, []
    for shared, batch in cells:
        cell = Cell(shared, TAIL, batch)
        assert (BLOCK, HKV, D) == (32, 8, 128)
        arms, checks = arms_of(cell, kernels_of)
        print(f"{shared} x {batch}: {checks}", flush=True)
        bad = {k: v for k, v in checks.items() if v is not True and not (isinstance(v, float) and v <= TOLERANCE)}
        if bad:
            raise SystemExit(f"{shared} x {batch}: arms disagree: {bad}")
        if once:       # one call of each arm (a profiler's run)
            mx.eval([call(1) for call in arms.values()])
            continue
        timed = measure_all(arms, 11)
        report[f"{shared}x{batch}"] = {"checks": checks, "timed": timed}
        base = {kind: timed[f"int8 {kind}, main"]["s"] for kind in ("cascade", "level 0")}
        lines += [f"\n{shared} shared x {batch} (tail {TAIL}, {SETS} pool sets)", "",
                  "| arm | ms | IQR ms | int8 main / arm |", "|---|---|---|---|"]
        for name, t in timed.items():
            kind = "cascade" if "cascade" in name else "level 0"
            lines.append(f"| {name} | {t['s'] * 1e3:.4f} | {t['iqr_s'] * 1e3:.4f} | {base[kind] / t['s']:.3f}x |")
        print("\n".join(lines[-len(timed) - 4:]), flush=True)
        (out / "probe.json").write_text(json.dumps(report, indent=1))
        (out / "probe.md").write_text("\n".join(lines) + "\n")
        del cell, arms
        mx.clear_cache()


if __name__ == "__main__":
    main()
