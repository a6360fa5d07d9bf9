"""Diagnostic: SM of each compute role of the one-launch step (folds disabled; smid written to out)."""
import dataclasses, json
import numpy as np
import mlx.core as mx
from mlxcel.kernels import cuda, fused
import gpu_attention_bench as b
p = cuda.KERNELS.platform
step = p.cascade_step_source.replace("  const int block = role;\n", '''  const int block = role;
  if (threadIdx.x == 0 && block < blocks0 + blocks1) {
    unsigned sm_; asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_));
    out[block] = static_cast<TQ>(float(sm_));
  }
''').replace("  // Fold role", "  return;\n  // Fold role")
assert step != p.cascade_step_source
diag = fused.FusedKernels(dataclasses.replace(p, cascade_step_source=step))
for shared, batch in [(8192, 32), (32768, 32), (8192, 4)]:
    cell = b.Cell(shared, 256, batch)
    plan, layout, private = cell.cascade_views
    (stacked, plan0), (flat, plan1) = diag.cascade_levels(32, 8, len(plan.members), layout.shared, private)
    n0, n1 = plan0.num_tiles * stacked.groups * 8, plan1.num_tiles * flat.groups * 8
    for rep in range(2):
        out = diag.cascade_decode(cell.queries[0], cell.k_pools[0], cell.v_pools[0], layout.shared, private,
                                  plan.members, scale=cell.scale)
        sm = np.array(out.astype(mx.float32)).reshape(-1)[: n0 + n1].astype(int)
        print(json.dumps({"cell": f"{shared}x{batch}", "rep": rep, "level0_blocks": n0, "level1_blocks": n1,
                          "level0_per_sm_hist": np.bincount(np.bincount(sm[:n0], minlength=132)).tolist(),
                          "all_per_sm_hist": np.bincount(np.bincount(sm, minlength=132)).tolist()}), flush=True)
