"""Host time of planning one decode step of a forest (CPU, no kernels run):
the planner's decision, the cascade layout, and preparing the launches, for
the portable kernels and for the fused ones (their host side; the CUDA
kernel factory is stood in for, so it runs on any machine).

    .venv/bin/python benchmarks/forest_plan_host.py [--repeats 200]

The cell is the issue's first: 32 rows = an 8K-token common prefix, 4 tenants
x 2K sub-prefix, 256 private tokens (32-token pages; 32 query heads, 8 KV
heads, head dim 128, bf16).
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

from mlxcel.engine import attention
from mlxcel.engine.cascade import explain_cascade
from mlxcel.engine.config import CascadeConfig
from mlxcel.kernels import AttentionShape, PagedCsrView, cuda, fused, portable
from mlxcel.kernels.csr import host_csr

BLOCK = 32


def forest_cell(rows=32, common=8192, tenants=4, sub=2048, private=256) -> PagedCsrView:
    common_pages, sub_pages, own = common // BLOCK, sub // BLOCK, private // BLOCK
    next_id = common_pages + tenants * sub_pages
    tables = []
    for r in range(rows):
        tenant = r % tenants
        base = common_pages + tenant * sub_pages
        tables.append(list(range(common_pages)) + list(range(base, base + sub_pages))
                      + list(range(next_id, next_id + own)))
        next_id += own
    tokens = [len(t) * BLOCK - 7 for t in tables]
    return PagedCsrView.from_host(host_csr(tables, tokens, BLOCK))


def median_us(call, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    settings = CascadeConfig(enabled=True, min_shared_pages=16, min_members=2).snapshot()
    shape = AttentionShape(32, 8, 128, mx.bfloat16, mx.bfloat16, BLOCK, 128 ** -0.5)
    host = forest_cell().host

    def fresh() -> PagedCsrView:       # a new layout each step, as when a row crosses a page boundary
        return PagedCsrView.from_host(host)

    plan = explain_cascade(fresh(), settings).plan
    print(f"plan: {len(plan.spans)} spans, depth {plan.depth}")
    decide = median_us(lambda: explain_cascade(fresh(), settings), args.repeats)
    layout = median_us(lambda: attention.cascade_layout(fresh(), plan), args.repeats)

    def composed():
        csr = fresh()
        lay = attention.cascade_layout(csr, plan)
        [portable.prepare_partial(lv.view, shape.stacked(lv.width)) for lv in lay.levels]
        portable.prepare_partial(lay.private_view(csr), shape)
        portable.prepare_merge(lay.merge_indptr, shape.head_dim)

    mx.fast.cuda_kernel = lambda **_: (lambda **__: None)   # the fused host side only
    kernels = fused.FusedKernels(cuda.KERNELS.platform)

    def fused_prepare():
        csr = fresh()
        lay = attention.cascade_layout(csr, plan)
        kernels.prepare_cascade(shape, csr.num_rows, lay.private_view(csr), lay.kernel_levels)

    def fused_kept():
        # A new layout of the same spans (a row's private suffix grew by a
        # page): the decision, then only the private level and the merge.
        csr = fresh()
        kept = explain_cascade(csr, settings).plan
        lay = attention.cascade_layout(csr, kept, first_layout)
        kernels.prepare_cascade(shape, csr.num_rows, lay.private_view(csr), lay.kernel_levels, reuse=first)

    first_csr = fresh()
    first_layout = attention.cascade_layout(first_csr, plan)
    first = kernels.prepare_cascade(shape, first_csr.num_rows, first_layout.private_view(first_csr),
                                    first_layout.kernel_levels)
    rows = [("planner decision (trie walk, spans)", decide), ("cascade layout", layout),
            ("layout + portable launches prepared", median_us(composed, args.repeats)),
            ("layout + fused launches prepared", median_us(fused_prepare, args.repeats)),
            ("same spans: decision + private level", median_us(fused_kept, args.repeats))]
    for name, us in rows:
        print(f"{name:<40} {us:8.1f} us")


if __name__ == "__main__":
    main()
