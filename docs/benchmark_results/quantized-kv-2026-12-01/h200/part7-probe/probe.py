"""Which part of the int8 warpgroup level is wrong: one cascade step (64 members behind 24 pages) with the pools'
scales as drawn, all ones, K's ones, V's ones; each step's relative error against float64 and its norm ratio."""
import mlx.core as mx
import numpy as np

import test_fused_kernels as t
from mlxcel.engine import attention
from mlxcel.engine.cascade import plan_cascade
from mlxcel.kernels import AttentionShape, cuda
from mlxcel.kernels.reference import reference_decode

rng = np.random.default_rng(7)
t.cuda.KERNELS.poison = float("nan")
case = t.shared_prefix_case(rng, "int8", members=64, group=1)
layout = attention.cascade_layout(case.csr, plan_cascade(case.csr, t.ON))
private, levels = layout.private_view(case.csr), layout.kernel_levels
shape = AttentionShape.of(case.q, case.k_pool, case.scale)
step = cuda.KERNELS.prepare_cascade(shape, case.q.shape[0], private, levels)
print("level 0 kernel:", step.levels[0].launch.options["template"][:3], flush=True)
ones_k = case.k_pool._replace(scales=mx.ones_like(case.k_pool.scales))
ones_v = case.v_pool._replace(scales=mx.ones_like(case.v_pool.scales))
for name, k, v in [("drawn", case.k_pool, case.v_pool), ("ones", ones_k, ones_v), ("k ones", ones_k, case.v_pool),
                   ("v ones", case.k_pool, ones_v)]:
    mx.eval(k, v)
    o = np.array(step(case.q, k, v, private.last_page_len).astype(mx.float32))
    want = reference_decode(case.q, k, v, case.host, case.scale)
    rows = [float(np.linalg.norm(o[r] - want[r]) / np.linalg.norm(want[r])) for r in range(o.shape[0])]
    print(name, "error", t.relative_error(o, want), "norm ratio", np.linalg.norm(o) / np.linalg.norm(want),
          "nan", int(np.isnan(o).sum()), "rows worst", np.round(sorted(rows)[-3:], 3), "best", round(min(rows), 4),
          flush=True)
