"""Diagnostic: the one-launch cascade step's waiting, in variants, beside the three-launch step."""
import dataclasses, json, sys, importlib.util
import mlx.core as mx
from mlxcel.kernels import cuda, fused
import gpu_attention_bench as b

spec = importlib.util.spec_from_file_location("cuda_v1", "ab_step/cuda_v1.py")
v1 = importlib.util.module_from_spec(spec); spec.loader.exec_module(v1)
p = cuda.KERNELS.platform
def variant(header=None, step=None):
    return fused.FusedKernels(dataclasses.replace(p, header=header or p.header, cascade_step_source=step or p.cascade_step_source))
H, S = p.header, p.cascade_step_source
RELAXED = H.replace('asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");\n    if (seen >= target) return;',
                    'asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");\n    if (seen >= target) { asm volatile("fence.acq_rel.gpu;" ::: "memory"); return; }')
assert RELAXED != H
variants = {
    "three": fused.FusedKernels(p, single_launch=False),
    "dyn": variant(),
    "dyn_relaxed": variant(RELAXED),
    "dyn_relaxed_1000": variant(RELAXED.replace("__nanosleep(200)", "__nanosleep(1000)")),
    "dyn_nowait": variant(H.replace("if (seen >= target) return;", "return;")),
}
cells = [(8192, 32), (32768, 32), (2048, 32)]
out = []
for rnd in range(3):
    for shared, batch in cells:
        cell = b.Cell(shared, 256, batch)
        plan, layout, private = cell.cascade_views
        ref = cell.flat(0)
        for name, k in variants.items():
            def call(i, dep=None, k=k):
                s = i % cell.sets
                return k.cascade_decode(cell.query(i, dep), cell.k_pools[s], cell.v_pools[s], layout.shared, private,
                                        plan.members, scale=cell.scale)
            err = b.relative_error(call(0), ref)
            r = {"round": rnd, "shared": shared, "batch": batch, "variant": name, "vs_flat": err, **b.measure(call, 10)}
            out.append(r)
            print(json.dumps({k2: (round(v * 1e6, 1) if k2.endswith("_s") else v) for k2, v in r.items()}), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
