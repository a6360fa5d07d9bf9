"""The fused CUDA kernels against the float64 reference, on a CUDA device.

Every check draws fresh random inputs (the seed is printed on failure) and
every kernel output is filled with NaN before the kernel runs, so an element
the kernel does not write cannot pass. Errors are relative norms
||out - ref|| / ||ref|| (and the largest absolute lse error, log2 units),
recorded as junit properties so the GPU run keeps the numbers.

Tolerances: the kernels feed the tensor cores 16-bit operands, so besides the
pool values the reference also reads, q and the softmax weights are rounded
to the pool's dtype (relative 2^-9 for bf16, 2^-11 for f16): expected errors
are ~1e-3 (bf16) and ~3e-4 (f16); 1e-2 and 3e-3 leave margin and stay far
below the O(0.1) error of a wrong mask, tile boundary, head mapping or merge.

Quantized pools ("int8", "int4") are checked against the float64 reference
over the very codes they hold (reference.as_float64 dequantizes them), so
quantization error is not in these numbers, only the kernel's operand
rounding: its operands are float16, so q and the weights round as for an f16
pool and the dequantized values once more (int8 keys stay exact codes, their
scale applied to the float32 scores): ~5e-4 expected, f16's 3e-3 bound. A
wrong scale, zero, nibble or channel order gives O(0.1) or more.

CI has no GPU: these tests skip there (reason given); benchmarks/gpu_suite.sh
runs them on the H200. The host-side logic is tested on the CPU by
test_tile_plan.py and test_fused_sources.py.
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from mlxcel.engine import attention, cost_model
from mlxcel.engine.attention import stack_member_heads, unstack_member_heads
from mlxcel.engine.cascade import plan_cascade
from mlxcel.engine.config import CascadeConfig
from mlxcel.engine.decode_plan import paged_decode_attention
from mlxcel.kernels import AttentionShape, PagedCsrView, cuda, fused
from mlxcel.kernels.csr import host_csr
from mlxcel.kernels.reference import reference_decode, reference_merge, reference_partial
from paged_cases import (FORESTS, OutcomeRecorder, forest_batch, fresh_blocks, make_case, mixed_batch,
                         random_pools, random_query)

pytestmark = pytest.mark.skipif(not mx.cuda.is_available(),
                                reason="the fused CUDA kernels need a CUDA device (CI has none; "
                                       "benchmarks/gpu_suite.sh runs these on the GPU)")

REL_TOL = {mx.bfloat16: 1e-2, mx.float16: 3e-3, "int8": 3e-3, "int4": 3e-3}
LSE_TOL = {mx.bfloat16: 1e-2, mx.float16: 3e-3, "int8": 3e-3, "int4": 3e-3}
POOLS = [mx.bfloat16, mx.float16, "int8", "int4"]   # float pools and quantized formats (paged_cases.random_pools)
QUANTIZED = ["int8", "int4"]
# Four levels deep (MAX_DEPTH), every level's span shared by two rows or more.
DEEPEST = [(4, [(3, [(2, [(2, [1, 2]), 1]), 1]), 2]), (3, [1, 1])]
ON = CascadeConfig(enabled=True, min_shared_pages=2, min_members=2)
OFF = CascadeConfig(enabled=False)


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    monkeypatch.setattr(cuda.KERNELS, "poison", float("nan"))
    # These cases check numerics on small spans: a cost model under which
    # every span pays (the measured one is tested below and in test_cost_model.py).
    monkeypatch.setattr(cost_model, "current", lambda measure: EVERY_SPAN_PAYS)


EVERY_SPAN_PAYS = cost_model.CostModel("cuda", "gpu", launch_s=0.0, bytes_per_s=1.0, state_s=0.0)


def relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def check_partial(record_property, q, k_pool, v_pool, host, scale, o, lse, dtype):
    ref_o, ref_lse = reference_partial(q, k_pool, v_pool, host, scale)
    o, lse = np.array(o), np.array(lse)
    assert not np.isnan(o).any() and not np.isnan(lse).any(), "an output element was never written"
    error, lse_error = relative_error(o, ref_o), float(np.abs(lse - ref_lse).max())
    record_property("relative_error_o", error)
    record_property("max_abs_error_lse", lse_error)
    assert error <= REL_TOL[dtype]
    assert lse_error <= LSE_TOL[dtype]


def query_dtype(pool):
    """The queries beside a pool: its own dtype, bf16 beside quantized pages."""
    return mx.bfloat16 if isinstance(pool, str) else pool


def run_partial(case, chunk_pages=None):
    assert fused.unsupported(AttentionShape.of(case.q, case.k_pool, case.scale)) is None   # not the fallback
    return cuda.paged_attention_partial(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale,
                                        chunk_pages=chunk_pages)


@pytest.mark.parametrize("chunk_pages", [None, 2])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", POOLS)
def test_partial_matches_reference(rng, record_property, dtype, group, head_dim, block_size, chunk_pages):
    # Mixed lengths, partially filled last pages, first pages entered mid-page;
    # chunk_pages=2 cuts rows into several tiles, so the tile merge runs too.
    case = mixed_batch(rng, block_size=block_size, group=group, head_dim=head_dim, dtype=dtype)
    o, lse = run_partial(case, chunk_pages)
    check_partial(record_property, case.q, case.k_pool, case.v_pool, case.host, case.scale, o, lse, dtype)


@pytest.mark.parametrize("block_size, head_dim", [(8, 64), (24, 128)])
def test_pages_that_a_copy_pass_straddles(rng, record_property, block_size, head_dim):
    # Pages that do not tile a chunk's copy passes: each pass row looks up its own page.
    case = mixed_batch(rng, block_size=block_size, group=4, head_dim=head_dim, dtype=mx.bfloat16)
    o, lse = run_partial(case, 3)
    check_partial(record_property, case.q, case.k_pool, case.v_pool, case.host, case.scale, o, lse, mx.bfloat16)


@pytest.mark.parametrize("pool", [mx.bfloat16, *QUANTIZED])
@pytest.mark.parametrize("q_dtype", [mx.bfloat16, mx.float16])
def test_half_precision_queries(rng, record_property, q_dtype, pool):
    case = mixed_batch(rng, block_size=32, group=4, head_dim=128, dtype=pool, q_dtype=q_dtype)
    o, lse = run_partial(case)
    check_partial(record_property, case.q, case.k_pool, case.v_pool, case.host, case.scale, o, lse, pool)


@pytest.mark.parametrize("kv_heads", [1, 3])
@pytest.mark.parametrize("fmt", QUANTIZED)
def test_quantized_pools_of_an_odd_kv_head_count(rng, record_property, fmt, kv_heads):
    # An int8 row's scale is staged as the aligned pair of rows holding it;
    # with an odd KV head count its half alternates from token to token.
    case = mixed_batch(rng, block_size=16, kv_heads=kv_heads, group=4, head_dim=128, dtype=fmt)
    o, lse = run_partial(case)
    check_partial(record_property, case.q, case.k_pool, case.v_pool, case.host, case.scale, o, lse, fmt)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", POOLS)
def test_long_rows_are_split_into_tiles_and_merged(rng, record_property, dtype, block_size):
    # Serving shapes (8 KV heads x 4): rows of hundreds of pages cross many
    # 64-token chunks and several tiles; offsets and partial pages at both ends.
    pages = [160, 9, 75, 130]
    ids = iter(fresh_blocks(rng, sum(pages) + 3))
    tables = [[next(ids) for _ in range(p)] for p in pages]
    tokens = [(p - 1) * block_size + int(rng.integers(1, block_size + 1)) for p in pages]
    offsets = [int(rng.integers(1, block_size)), 0, int(rng.integers(1, block_size)), 0]
    case = make_case(rng, tables, tokens, block_size=block_size, kv_heads=8, group=4, head_dim=128,
                     first_page_offset=offsets, dtype=dtype, num_blocks=sum(pages) + 3)
    plan = fused.fused_tiles(case.csr, None, fused.head_layout(4, cuda.KERNELS.platform.warps), 8)
    assert not plan.one_per_row
    o, lse = run_partial(case)
    check_partial(record_property, case.q, case.k_pool, case.v_pool, case.host, case.scale, o, lse, dtype)


@pytest.mark.parametrize("growing", [True, False])
def test_exponent_base_follows_scores_along_a_row(rng, record_property, growing):
    # Each key gets an offset along its head's query: token t's score is a
    # small random part plus a ramp from -40 up to 0 (or down from 0), so the
    # largest score climbs by ~58 log2 units along the row's ten chunks and
    # the kernel's exponent base has to move again and again mid-row (or is
    # set by the first step and never moves). The tokens that carry the
    # weight have small scores, so 16-bit rounding stays at its usual size.
    block_size, pages, kv_heads, d = 32, 20, 8, 128
    ids = fresh_blocks(rng, pages)
    case = make_case(rng, [ids], [pages * block_size], block_size=block_size, kv_heads=kv_heads, group=1,
                     head_dim=d, dtype=mx.bfloat16)
    q = np.array(case.q)[0]                                          # [Hkv, D]: one query head per KV head
    ramp = np.linspace(-40.0, 0.0, pages * block_size)
    offsets = ramp if growing else ramp[::-1]
    keys = 0.5 * np.array(case.k_pool.astype(mx.float32))
    for slot, offset in enumerate(offsets):
        keys[ids[slot // block_size], slot % block_size] += offset * q / (case.scale * (q * q).sum(-1, keepdims=True))
    k_pool = mx.array(keys).astype(mx.bfloat16)
    o, lse = cuda.paged_attention_partial(case.q, k_pool, case.v_pool, case.csr, scale=case.scale)
    check_partial(record_property, case.q, k_pool, case.v_pool, case.host, case.scale, o, lse, mx.bfloat16)


@pytest.mark.parametrize("pool", [mx.bfloat16, *QUANTIZED])
@pytest.mark.parametrize("members", [1, 3, 8, 32, 64])
def test_stacked_heads_of_a_cascade_level_0(rng, record_property, members, pool):
    # Level 0: one row of full shared pages, M * G stacked heads per KV head:
    # 4 (one warp tile) up to 256 (four head groups of 64 per block).
    kv_heads, group, d, block_size = 2, 4, 128, 32
    ids = fresh_blocks(rng, 40)
    host = host_csr([ids[:24]], [24 * block_size], block_size)
    k_pool, v_pool = random_pools(rng, 40, block_size, kv_heads, d, pool)
    q = stack_member_heads(random_query(rng, members, kv_heads * group, d), kv_heads)
    o, lse = cuda.paged_attention_partial(q, k_pool, v_pool, PagedCsrView.from_host(host), scale=d ** -0.5)
    check_partial(record_property, q, k_pool, v_pool, host, d ** -0.5, o, lse, pool)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_merge_matches_reference(rng, record_property, head_dim):
    sizes = [0, 1, 3, 2, 40, 5]
    count, heads = sum(sizes), 12
    v_in = rng.standard_normal((count, heads, head_dim)).astype(np.float32)
    lse_in = (rng.standard_normal((count, heads)) * 4).astype(np.float32)
    lse_in[2, :5] = -np.inf                    # states with no tokens ...
    v_in[2, :5] = np.nan                       # ... whose values must not leak
    lse_in[1:4, 7] = -np.inf                   # a whole group without weight: v 0, lse -inf
    indptr = np.concatenate([[0], np.cumsum(sizes)])
    v, lse = cuda.merge_states(mx.array(v_in), mx.array(lse_in), indptr)
    ref_v, ref_lse = reference_merge(v_in, lse_in, indptr)
    v, lse = np.array(v), np.array(lse)
    assert not np.isnan(v).any()
    assert (v[2, 7] == 0).all() and lse[2, 7] == -np.inf
    record_property("relative_error_v", relative_error(v, ref_v))
    np.testing.assert_allclose(v, ref_v, atol=1e-5, rtol=0)       # float32 arithmetic on float32 states
    np.testing.assert_allclose(lse, ref_lse, atol=1e-5, rtol=0)


def shared_prefix_case(rng, dtype, members=8, shared_pages=24, block_size=32, group=4, outsider=True,
                       tail_pages=3, head_dim=128):
    """``members`` rows behind ``shared_pages`` pages, with 1..tail_pages own
    pages each, and (``outsider``) one row after them sharing nothing."""
    blocks = shared_pages + (tail_pages + 1) * members + 8
    ids = iter(fresh_blocks(rng, blocks))
    shared = [next(ids) for _ in range(shared_pages)]
    tables = [shared + [next(ids) for _ in range(tail_pages - m % 3)] for m in range(members)]
    if outsider:
        tables.append([next(ids) for _ in range(5)])
    tokens = [(len(t) - 1) * block_size + int(rng.integers(1, block_size + 1)) for t in tables]
    return make_case(rng, tables, tokens, block_size=block_size, kv_heads=8, group=group, head_dim=head_dim,
                     dtype=dtype, q_dtype=query_dtype(dtype), num_blocks=blocks)


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("members", [2, 8, 64])
@pytest.mark.parametrize("dtype", POOLS)
def test_cascade_decode_in_three_launches(rng, record_property, dtype, members, group):
    # Level 0 reads the members' queries through the member list (up to 512
    # stacked heads per KV head: eight head groups), level 1 the private
    # pages and folds both into the output dtype (a tile a row: no merge launch).
    case = shared_prefix_case(rng, dtype, members=members, group=group)
    plan = plan_cascade(case.csr, ON)
    assert len(plan.members) == members
    layout = attention.cascade_layout(case.csr, plan)
    o = cuda.cascade_decode(case.q, case.k_pool, case.v_pool, layout.private_view(case.csr), layout.kernel_levels,
                            scale=case.scale)
    assert o.dtype == query_dtype(dtype) and o.shape == case.q.shape
    o = np.array(o.astype(mx.float32))
    assert not np.isnan(o).any(), "an output element was never written"
    error = relative_error(o, reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale))
    record_property("relative_error_o", error)
    assert error <= REL_TOL[dtype]


@pytest.mark.parametrize("level0_pages", [None, 13])
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("pool", [mx.bfloat16, *QUANTIZED])
def test_level0_staging_rings(rng, record_property, pool, stages, level0_pages):
    # Level 0's ring of 2 to 4 chunks: the default tiles (about 256 tokens,
    # four chunks, as many as the deepest ring) and 13-page ones (416 tokens,
    # seven chunks, the last one half past the tile's end).
    case = shared_prefix_case(rng, pool, members=8, shared_pages=52)
    plan = plan_cascade(case.csr, ON)
    layout = attention.cascade_layout(case.csr, plan)
    o = cuda.cascade_decode(case.q, case.k_pool, case.v_pool, layout.private_view(case.csr), layout.kernel_levels,
                            scale=case.scale, level0_pages=level0_pages, level0_stages=stages)
    o = np.array(o.astype(mx.float32))
    assert not np.isnan(o).any(), "an output element was never written"
    error = relative_error(o, reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale))
    record_property("relative_error_o", error)
    assert error <= REL_TOL[pool]


@pytest.mark.skipif(not cuda.hopper(), reason="warpgroup MMA needs compute capability 9.x")
@pytest.mark.parametrize("members, group, head_dim, block_size, level0_pages, stages", [
    (9, 4, 128, 32, None, 2),    # 36 stacked heads: one head group, its rows 36..63 empty
    (16, 4, 128, 32, 13, 2),     # 64, one full group; 13-page tiles: a last chunk half past the tile's end
    (32, 4, 128, 16, None, 3),   # 128 (the e2e cell's: two groups), 16-token pages, a ring of three chunks
    (25, 4, 64, 24, 13, 2),      # 100 at D=64, 24-token pages (a copy pass straddles two)
    (64, 4, 128, 32, None, 4),   # 256: four groups, a ring of four
    (3, 16, 128, 32, None, 2),   # 48: three members of 16 heads each
])
@pytest.mark.parametrize("per_block", [1, 2])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, "int8"])
def test_level0_on_warpgroup_mma(rng, record_property, monkeypatch, dtype, per_block, members, group, head_dim,
                                 block_size, level0_pages, stages):
    # The stacked level on the warpgroup kernel (asserted: its launch) in
    # blocks of one or two warpgroups, and the same step with the partial
    # kernel's, each against float64 (int8 pages: over the codes they hold).
    monkeypatch.setitem(fused.WARPGROUP_BLOCKS, "int8" if dtype == "int8" else None, (per_block, None))
    case = shared_prefix_case(rng, dtype, members=members, group=group, shared_pages=1664 // block_size,
                              block_size=block_size, head_dim=head_dim)
    layout = attention.cascade_layout(case.csr, plan_cascade(case.csr, ON))
    private, levels = layout.private_view(case.csr), layout.kernel_levels
    shape = AttentionShape.of(case.q, case.k_pool, case.scale)
    want = reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale)
    for kernel in ("warpgroup", "mma"):
        monkeypatch.setenv(fused.LEVEL0_KERNEL_ENV, kernel)
        step = cuda.KERNELS.prepare_cascade(shape, case.q.shape[0], private, levels, level0_pages=level0_pages,
                                            level0_stages=stages)
        warps = 4 * min(per_block, -(-members * group // fused.WARPGROUP_ROWS))
        quant = shape.kv_quant
        warpgroup = cuda.KERNELS._kernel("warpgroup_quantized_partial" if quant else "warpgroup_partial", head_dim,
                                         warps, quant, stages)
        assert (step.levels[0].launch.kernel is warpgroup) == (kernel == "warpgroup")
        assert step.merge is None                                      # the private level (a tile a row) merges
        o = np.array(step(case.q, case.k_pool, case.v_pool, private.last_page_len).astype(mx.float32))
        assert not np.isnan(o).any(), "an output element was never written"
        error = relative_error(o, want)
        record_property(f"relative_error_o_{kernel}", error)
        assert error <= REL_TOL[dtype], kernel


@pytest.mark.skipif(not cuda.hopper(), reason="warpgroup MMA needs compute capability 9.x")
@pytest.mark.parametrize("forest", [*FORESTS, "four deep"])
def test_forest_cascade_on_warpgroup_mma(rng, record_property, monkeypatch, forest):
    # 16 heads a row: a span of three members or more stacks over 32 heads, its depth's launch the
    # warpgroup kernel's (a narrower span of that depth pads with a repeated member).
    trees = FORESTS[forest][0] if forest in FORESTS else DEEPEST
    case, _ = forest_batch(rng, trees, block_size=16, kv_heads=8, group=16, head_dim=128, dtype=mx.bfloat16,
                           q_dtype=mx.bfloat16)
    layouts = []
    real = cuda.KERNELS.partial_launch
    monkeypatch.setattr(cuda.KERNELS, "partial_launch",
                        lambda shape, tiles, layout, *a, **k: layouts.append(layout) or real(shape, tiles, layout, *a, **k))
    metrics = OutcomeRecorder()
    o = paged_decode_attention(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale, config=ON,
                               metrics=metrics)
    assert metrics.last_outcome.kind == "cascade"
    assert all(layout.warpgroup == (layout.heads > 32) for layout in layouts)
    assert any(layout.warpgroup for layout in layouts)
    o = np.array(o.astype(mx.float32))
    assert not np.isnan(o).any(), "an output element was never written"
    error = relative_error(o, reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale))
    record_property("relative_error_o", error)
    assert error <= REL_TOL[mx.bfloat16]


@pytest.mark.parametrize("pool", [mx.bfloat16, *QUANTIZED])
@pytest.mark.parametrize("outsider, tail_pages", [(False, 3), (True, 3), (False, 40), (True, 40)])
def test_cascade_merge_with_and_without_lookups(rng, record_property, outsider, tail_pages, pool):
    # The merge skips its row lookups when every row is a member in order;
    # a short tail (one level-1 tile a row) is merged by the private level's
    # launch, a long one by the cascade merge's: each of the four
    # combinations is a kernel variant of its own.
    case = shared_prefix_case(rng, pool, members=8, outsider=outsider, tail_pages=tail_pages)
    plan = plan_cascade(case.csr, ON)
    layout = attention.cascade_layout(case.csr, plan)
    private = layout.private_view(case.csr)
    _, (_, level1) = cuda.KERNELS.cascade_levels(32, 8, private, layout.kernel_levels)
    assert (list(plan.members) == list(range(case.csr.num_rows))) == (not outsider)
    assert level1.one_per_row == (tail_pages == 3)
    o = cuda.cascade_decode(case.q, case.k_pool, case.v_pool, private, layout.kernel_levels, scale=case.scale)
    o = np.array(o.astype(mx.float32))
    assert not np.isnan(o).any(), "an output element was never written"
    error = relative_error(o, reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale))
    record_property("relative_error_o", error)
    assert error <= REL_TOL[pool]


@pytest.mark.parametrize("pool", [mx.bfloat16, *QUANTIZED])
def test_engine_cascade_with_dropped_and_unrelated_rows(rng, record_property, pool):
    # The planner's mixed batch: three members, a row sharing only two pages, a
    # mid-page row (dropped), an unrelated row; partial last pages everywhere.
    case = mixed_batch(rng, block_size=16, group=4, head_dim=128, dtype=pool, q_dtype=mx.bfloat16)
    metrics = OutcomeRecorder()
    o = paged_decode_attention(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale, config=ON,
                               metrics=metrics)
    assert metrics.last_outcome.kind == "cascade"
    error = relative_error(np.array(o.astype(mx.float32)),
                           reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale))
    record_property("relative_error_o", error)
    assert error <= REL_TOL[pool]


@pytest.mark.parametrize("dtype", POOLS)
def test_engine_cascade_on_the_fused_kernels(rng, record_property, dtype):
    case = shared_prefix_case(rng, dtype)
    metrics = OutcomeRecorder()
    run = lambda config: np.array(paged_decode_attention(                    # noqa: E731
        case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale, config=config, metrics=metrics
    ).astype(mx.float32))
    cascaded = run(ON)
    assert metrics.last_outcome.kind == "cascade" and len(metrics.last_outcome.plan.members) == 8
    flat = run(OFF)
    ref = reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale)
    errors = relative_error(cascaded, ref), relative_error(flat, ref), relative_error(cascaded, flat)
    for name, value in zip(("cascade_vs_reference", "flat_vs_reference", "cascade_vs_flat"), errors):
        record_property(name, value)
    assert max(errors) <= REL_TOL[dtype]


def test_member_major_stacking_gives_a_wrong_answer_on_the_fused_kernels(rng):
    # The negative control of test_attention.py, on the tensor-core kernels.
    case = shared_prefix_case(rng, mx.bfloat16)
    plan = plan_cascade(case.csr, ON)
    level = attention.cascade_layout(case.csr, plan).levels[0]
    q_members, members = case.q[level.stacked_rows], len(plan.members)
    hq, d, hkv = case.q.shape[1], case.q.shape[2], case.num_kv_heads
    # Each member alone over the shared span: what level 0 must give once unstacked.
    shared_rows = host_csr([level.view.host.pages(0).tolist()] * members,
                           [plan.shared_pages * case.host.block_size] * members, case.host.block_size)
    want = reference_partial(q_members, case.k_pool, case.v_pool, shared_rows, case.scale)[0]

    def level0(stacked, unstack):
        o, lse = cuda.paged_attention_partial(stacked, case.k_pool, case.v_pool, level.view, scale=case.scale)
        return np.array(unstack(o, lse)[0])

    right = level0(stack_member_heads(q_members, hkv), lambda o, lse: unstack_member_heads(o, lse, members, hkv))
    wrong = level0(q_members.reshape(1, members * hq, d),
                   lambda o, lse: (o.reshape(members, hq, d), lse.reshape(members, hq)))
    assert relative_error(right, want) <= REL_TOL[mx.bfloat16]
    assert relative_error(wrong, want) > 0.3


def test_plans_the_measured_cost_model_declines_run_flat(rng, monkeypatch, tmp_path):
    # The device's own constants (measured here, in seconds), then a span of
    # 24 pages x 7 saved reads (21 MB) against a launch cost raised past it.
    model = cost_model.calibrate()
    assert model.backend == "cuda" and model.launch_s > 0 and 1e11 < model.bytes_per_s < 1e13
    monkeypatch.setattr(cost_model, "current", lambda measure: replace(model, launch_s=1.0))
    case = shared_prefix_case(rng, mx.bfloat16)
    metrics = OutcomeRecorder()
    o = paged_decode_attention(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale, config=ON,
                               metrics=metrics)
    outcome = metrics.last_outcome
    assert outcome.kind == "flat" and "predicted saving" in outcome.reason and outcome.predicted_saving_s < 0
    ref = reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale)
    assert relative_error(np.array(o.astype(mx.float32)), ref) <= REL_TOL[mx.bfloat16]


@pytest.mark.parametrize("forest", [*FORESTS, "four deep"])
@pytest.mark.parametrize("dtype", POOLS)
def test_forest_cascade_on_the_fused_kernels(rng, record_property, dtype, forest):
    # Several groups (spans of different widths at one depth: the narrower
    # pad), nesting up to three deep (four: MAX_DEPTH), rows shuffled, a
    # mid-page and a one-page row beside them: one stacked launch per depth,
    # the private level, the merge.
    trees, groups, depth = FORESTS[forest] if forest in FORESTS else (DEEPEST, 2, fused.MAX_DEPTH)
    case, _ = forest_batch(rng, trees, block_size=16, kv_heads=8, group=4, head_dim=128, dtype=dtype,
                           q_dtype=query_dtype(dtype))
    metrics = OutcomeRecorder()
    o = paged_decode_attention(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale, config=ON,
                               metrics=metrics)
    plan = metrics.last_outcome.plan
    assert metrics.last_outcome.kind == "cascade" and (len(plan.levels[0]), plan.depth) == (groups, depth)
    o = np.array(o.astype(mx.float32))
    assert not np.isnan(o).any(), "an output element was never written"
    error = relative_error(o, reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale))
    record_property("relative_error_o", error)
    assert error <= REL_TOL[dtype]


@pytest.mark.parametrize("groups", [1, 3])
def test_fused_launches_per_step_do_not_grow_with_the_groups(rng, monkeypatch, groups):
    # Depth 2 in every group: two stacked launches, the private one, the merge.
    case, _ = forest_batch(rng, [(5, [(3, [1, 2]), 1, 2])] * groups, block_size=16, kv_heads=8, group=4,
                           head_dim=128, dtype=mx.bfloat16, q_dtype=mx.bfloat16)
    launched = []
    real = fused.Launch.__call__
    monkeypatch.setattr(fused.Launch, "__call__", lambda self, *a: launched.append(1) or real(self, *a))
    o = paged_decode_attention(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale, config=ON)
    assert len(launched) == 4
    error = relative_error(np.array(o.astype(mx.float32)),
                           reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale))
    assert error <= REL_TOL[mx.bfloat16]
