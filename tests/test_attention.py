"""The decode path: flat and cascade launches against the reference and each
other, head stacking, one plan per step, fallback, gather path, metrics."""

from __future__ import annotations

import logging

import mlx.core as mx
import numpy as np
import pytest

from mlxcel import kernels
from mlxcel.engine import attention, cascade, decode_plan
from mlxcel.engine.attention import (ComposedCascade, paged_prefill_attention, prepare_cascade_launch,
                                     prepare_flat_launch, stack_member_heads, unstack_member_heads)
from mlxcel.engine.cascade import CascadePlan, SharedSpan
from mlxcel.engine.config import CascadeConfig
from mlxcel.engine.decode_plan import DecodePlanner, paged_decode_attention
from mlxcel.kernels import AttentionShape, CsrBuilder
from mlxcel.kernels.csr import grew_from, host_csr
from mlxcel.kernels.reference import reference_decode, reference_prefill
from paged_cases import (ATOL, FORESTS, OutcomeRecorder, forest_batch, fresh_blocks, kernel_atol, make_case,
                         mixed_batch)

ON = CascadeConfig(enabled=True, min_shared_pages=2, min_members=2)
OFF = CascadeConfig(enabled=False)

# Cascade vs flat: both accumulate the same float32 products, only grouped
# differently (two levels and a merge vs one pass), so they differ by float32
# rounding of O(1) values: a few 1e-7. 1e-5 leaves room for that and is four
# orders below what a wrong stacking or pairing produces (see the negative control).
CASCADE_ATOL = 1e-5


# mixed_batch's plan: rows 0-3 share two pages, rows 0-2 three more (a nested span).
MIXED_SPANS = (SharedSpan((0, 1, 2, 3), 0, 2), SharedSpan((0, 1, 2), 2, 5))


def launches(metrics, path):
    return metrics.registry.get_sample_value("mlxcel_paged_decode_launches_total", {"path": path})


def sample(metrics, name):
    return metrics.registry.get_sample_value(name)


def decode(case, config, metrics=None, q=None):
    q = case.q if q is None else q
    return paged_decode_attention(q, case.k_pool, case.v_pool, case.csr, scale=case.scale, config=config,
                                  metrics=metrics)


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
def test_cascade_equals_flat_and_reference(rng, group, head_dim, block_size):
    # Members with different private tails, a row sharing only two pages, a
    # mid-page row, an unrelated row: one launch serves the mixed batch.
    case = mixed_batch(rng, block_size=block_size, group=group, head_dim=head_dim)
    metrics = OutcomeRecorder()
    cascaded = decode(case, ON, metrics)
    assert metrics.last_outcome.kind == "cascade"
    assert metrics.last_outcome.plan.spans == MIXED_SPANS
    flat = decode(case, OFF)
    np.testing.assert_allclose(np.array(cascaded), np.array(flat), atol=CASCADE_ATOL, rtol=0)
    np.testing.assert_allclose(np.array(cascaded), reference_decode(case.q, case.k_pool, case.v_pool, case.host,
                                                                    case.scale), atol=ATOL, rtol=0)


@pytest.mark.parametrize("pool_dtype", [mx.float16, mx.bfloat16])
@pytest.mark.parametrize("q_dtype", [mx.float32, mx.bfloat16])
def test_half_precision_pools_and_queries(rng, pool_dtype, q_dtype):
    case = mixed_batch(rng, block_size=16, group=4, head_dim=128, dtype=pool_dtype, q_dtype=q_dtype)
    cascaded, flat = decode(case, ON), decode(case, OFF)
    assert cascaded.dtype == q_dtype and flat.dtype == q_dtype
    ref = reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale)
    # A bf16 result carries bf16 rounding (8 mantissa bits) of values up to ~3.
    atol = max(kernel_atol(pool_dtype), ATOL if q_dtype == mx.float32 else 3e-2)
    np.testing.assert_allclose(np.array(cascaded.astype(mx.float32)), ref, atol=atol, rtol=0)
    np.testing.assert_allclose(np.array(cascaded.astype(mx.float32)), np.array(flat.astype(mx.float32)),
                               atol=max(atol, CASCADE_ATOL), rtol=0)


def shape_of(case):
    return AttentionShape.of(case.q, case.k_pool, case.scale)


def test_a_subgroup_of_one_is_the_flat_result(rng):
    # One member: level 0 over its shared span, level 1 over the rest, merged.
    case = mixed_batch(rng, block_size=16, group=4)
    args = (case.q, case.k_pool, case.v_pool, case.csr.last_page_len)
    one = prepare_cascade_launch(case.csr, CascadePlan([2], 5), shape_of(case))(*args)
    flat = prepare_flat_launch(case.csr, shape_of(case))(*args)
    np.testing.assert_allclose(np.array(one), np.array(flat), atol=CASCADE_ATOL, rtol=0)


def test_stacking_round_trips():
    members, hkv, group, d = 3, 2, 4, 8
    q = mx.arange(members * hkv * group * d, dtype=mx.float32).reshape(members, hkv * group, d)
    stacked = stack_member_heads(q, hkv)
    # h0 = kv * (M * G) + m * G + g holds member m's head kv * G + g.
    for kv in range(hkv):
        for m in range(members):
            for g in range(group):
                np.testing.assert_array_equal(np.array(stacked[0, kv * members * group + m * group + g]),
                                              np.array(q[m, kv * group + g]))
    o, lse = unstack_member_heads(stacked, stacked[..., 0], members, hkv)
    np.testing.assert_array_equal(np.array(o), np.array(q))
    np.testing.assert_array_equal(np.array(lse), np.array(q[..., 0]))


def test_member_major_stacking_gives_a_wrong_answer(rng):
    # Negative control: stacking member-major (h0 = m * (Hkv * G) + kv * G + g)
    # has the same shapes and launches fine, but the kernel's h0 // (M * G)
    # then reads the wrong KV head for most stacked heads.
    case = mixed_batch(rng, block_size=16, kv_heads=2, group=4)
    plan = CascadePlan([0, 1, 2], 5)
    layout = attention.cascade_layout(case.csr, plan)
    level = layout.levels[0]
    q_members, members = case.q[level.stacked_rows], len(plan.members)
    hq, d = case.q.shape[1], case.q.shape[2]

    def two_levels(q0_stacked, unstack):
        o0, lse0 = kernels.paged_attention_partial(q0_stacked, case.k_pool, case.v_pool, level.view,
                                                   scale=case.scale)
        o0, lse0 = unstack(o0, lse0)
        o1, lse1 = kernels.paged_attention_partial(case.q, case.k_pool, case.v_pool, layout.private_view(case.csr),
                                                   scale=case.scale)
        states = mx.concatenate([o1, o0])[layout.merge_order]
        lses = mx.concatenate([lse1, lse0])[layout.merge_order]
        return np.array(kernels.merge_states(states, lses, layout.merge_indptr)[0])

    ref = reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale)
    right = two_levels(stack_member_heads(q_members, case.num_kv_heads),
                       lambda o, lse: unstack_member_heads(o, lse, members, case.num_kv_heads))
    wrong = two_levels(q_members.reshape(1, members * hq, d),
                       lambda o, lse: (o.reshape(members, hq, d), lse.reshape(members, hq)))
    np.testing.assert_allclose(right, ref, atol=ATOL, rtol=0)
    member_rows = np.array(plan.members)
    assert np.abs(wrong[member_rows] - ref[member_rows]).max() > 0.05
    np.testing.assert_allclose(wrong[3:], ref[3:], atol=ATOL, rtol=0)   # non-members never see level 0


def test_the_shared_span_is_read_once_per_subgroup(rng, monkeypatch):
    case = mixed_batch(rng, block_size=16, group=4)
    calls = []
    real = kernels.prepare_partial
    monkeypatch.setattr(kernels, "prepare_partial",
                        lambda csr, shape, *a: calls.append((shape, csr.host)) or real(csr, shape, *a))
    monkeypatch.setattr(kernels, "prepare_cascade", lambda *a: None)   # the levels as separate launches
    decode(case, ON)
    (outer_shape, outer), (inner_shape, inner), (_, private) = calls
    pages = case.host.pages(0).tolist()
    assert outer.num_rows == 1 and outer.pages(0).tolist() == pages[:2]
    assert outer_shape.q_heads == 4 * case.q.shape[1]        # all 4 members' heads stacked on one row
    assert inner.num_rows == 1 and inner.pages(0).tolist() == pages[2:5]
    assert inner_shape.q_heads == 3 * case.q.shape[1]
    for member in (0, 1, 2):                                  # the private level: after each row's last span
        assert private.pages(member).tolist() == case.host.pages(member)[5:].tolist()
    assert private.pages(3).tolist() == case.host.pages(3)[2:].tolist()
    for other in (4, 5):                                      # non-members: their whole range
        assert private.pages(other).tolist() == case.host.pages(other).tolist()


def test_disabled_cascade_never_scans_the_page_table(rng, monkeypatch):
    case = mixed_batch(rng, block_size=16)
    decides, explains = [], []
    monkeypatch.setattr(cascade, "decide", lambda *a: decides.append(a))
    monkeypatch.setattr(decode_plan, "explain_cascade", lambda *a: explains.append(a))
    for _layer in range(4):
        decode(case, OFF)
    assert decides == [] and explains == []


def test_one_plan_per_step_kept_while_the_layout_and_settings_hold(rng, monkeypatch):
    case = mixed_batch(rng, block_size=16)
    scans, prepared = [], []
    real_decide, real_prepare = cascade.decide, decode_plan.prepare_cascade_launch
    monkeypatch.setattr(cascade, "decide", lambda *a: scans.append(a) or real_decide(*a))
    monkeypatch.setattr(decode_plan, "prepare_cascade_launch", lambda *a: prepared.append(a) or real_prepare(*a))
    builder, planner = CsrBuilder(16), DecodePlanner()
    tables = [case.host.pages(r).tolist() for r in range(case.host.num_rows)]
    tokens = case.host.num_tokens() + case.host.first_page_offset
    offsets = case.host.first_page_offset.tolist()
    config = CascadeConfig(enabled=True, min_shared_pages=2, min_members=2)
    want = np.array(decode(case, OFF))
    for step, key in enumerate(["layout-a", "layout-a", "layout-b", "layout-b"]):
        if step == 3:
            config.update(min_members=3)             # a live change: the next step plans anew
        csr = builder.build(key, tables, tokens.tolist(), offsets)
        plan = planner.plan(csr, config.snapshot(), shape_of(case))
        for _layer in range(6):
            o = plan.attend(case.q, case.k_pool, case.v_pool, csr.last_page_len)
        np.testing.assert_allclose(np.array(o), want, atol=CASCADE_ATOL, rtol=0)
        # Same layout and settings: the same plan. The same pages under a new key (a layout that grew by
        # nothing): the decision kept, the launch prepared again. New settings: one scan, one preparation.
        assert len(scans) == [1, 1, 1, 2][step] and len(prepared) == [1, 1, 2, 3][step]
        assert plan.outcome.kind == "cascade"


def test_multi_token_steps_take_the_gather_path_without_the_planner(rng, monkeypatch):
    case = mixed_batch(rng, block_size=16, group=4)
    scans = []
    monkeypatch.setattr(cascade, "decide", lambda *a: scans.append(a))
    metrics = OutcomeRecorder()
    q = mx.array(rng.standard_normal((6, 8, 3, 64)).astype(np.float32))
    o = decode(case, ON, metrics, q=q)
    assert scans == [] and metrics.last_outcome.kind == "gather"
    assert launches(metrics, "gather") == 1 and launches(metrics, "fused_v2") == 0
    np.testing.assert_allclose(np.array(o), reference_prefill(q, case.k_pool, case.v_pool, case.host, case.scale),
                               atol=ATOL, rtol=0)


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("length", [1, 5])
def test_gather_path_matches_reference(rng, group, length):
    case = mixed_batch(rng, block_size=16, group=group, head_dim=64)
    q = mx.array(rng.standard_normal((6, 2 * group, length, 64)).astype(np.float32))
    o = paged_prefill_attention(q, case.k_pool, case.v_pool, case.csr, scale=case.scale)
    assert o.shape == q.shape
    np.testing.assert_allclose(np.array(o), reference_prefill(q, case.k_pool, case.v_pool, case.host, case.scale),
                               atol=ATOL, rtol=0)


def test_gather_path_in_query_blocks_matches_reference(rng, monkeypatch):
    # A budget of one query token's scores for the widest row: 5 query tokens attended in 5 blocks (3 where
    # two fit), each token's softmax computed alone, the output the unblocked one's.
    case = mixed_batch(rng, block_size=16, group=4, head_dim=64)
    q = mx.array(rng.standard_normal((6, 8, 5, 64)).astype(np.float32))
    whole = np.array(paged_prefill_attention(q, case.k_pool, case.v_pool, case.csr, scale=case.scale))
    slots = int(case.host.num_pages().max()) * 16
    blocks = []
    real = attention.portable.dense_attention
    monkeypatch.setattr(attention.portable, "dense_attention", lambda q, *a, **k: blocks.append(q.shape[2]) or
                        real(q, *a, **k))
    for tokens, want in [(1, [1] * 5), (2, [2, 2, 1])]:
        blocks.clear()
        monkeypatch.setattr(attention, "PREFILL_SCORE_ELEMENTS", tokens * 6 * 8 * slots)
        o = np.array(paged_prefill_attention(q, case.k_pool, case.v_pool, case.csr, scale=case.scale))
        assert blocks == want
        # Float32 rounding apart (each block's matmuls may sum in another order), the unblocked output.
        np.testing.assert_allclose(o, whole, atol=1e-6, rtol=0)
        np.testing.assert_allclose(o, reference_prefill(q, case.k_pool, case.v_pool, case.host, case.scale),
                                   atol=ATOL, rtol=0)


def test_gather_path_attends_each_query_block_up_to_its_last_token(rng, monkeypatch):
    # Causal chunks on the CPU: query blocks of 2 (of 5 tokens), each over the keys up to the slot its last token
    # sees in the longest row, and no further (not its last page's tail: a case whose longest row ends mid-page,
    # drawn again where it fills its last page, one draw in 16); the output the reference's (the untrimmed keys
    # were masked).
    while True:
        case = mixed_batch(rng, block_size=16, group=4, head_dim=64)
        newest = int(((case.host.num_pages() - 1) * 16 + case.host.last_page_len).max()) - 1
        if newest + 1 < int(case.host.num_pages().max()) * 16:
            break
    q = mx.array(rng.standard_normal((6, 8, 5, 64)).astype(np.float32))
    seen = []
    real = attention.portable.dense_attention
    monkeypatch.setattr(attention.portable, "dense_attention",
                        lambda q, keys, *a, **k: seen.append((q.shape[2], keys.shape[2])) or real(q, keys, *a, **k))
    monkeypatch.setattr(attention, "CPU_QUERY_BLOCK", 2)
    o = np.array(paged_prefill_attention(q, case.k_pool, case.v_pool, case.csr, scale=case.scale))
    assert seen == [(2, newest - 2), (2, newest), (1, newest + 1)]
    np.testing.assert_allclose(o, reference_prefill(q, case.k_pool, case.v_pool, case.host, case.scale),
                               atol=ATOL, rtol=0)


@pytest.mark.parametrize("group", [1, 4])
def test_masked_attention_matches_float64(rng, group):
    # The GPU's gather-path attention (MLX's own unfused ops), run here on the CPU: fresh random inputs and a
    # random mask (each query sees at least one key) against float64; float32 matmuls over 40 keys of 64
    # channels and a softmax round to well under 1e-5.
    q = rng.standard_normal((2, 2 * group, 5, 64)).astype(np.float32)
    keys, values = (rng.standard_normal((2, 2, 40, 64)).astype(np.float32) for _ in range(2))
    mask = rng.random((2, 1, 5, 40)) < 0.6
    mask[..., 7] = True
    o = attention.masked_attention(mx.array(q), mx.array(keys), mx.array(values), mx.array(mask), scale=0.125)
    grouped = q.astype(np.float64).reshape(2, 2, group, 5, 64)
    scores = np.where(mask[:, :, None], np.einsum("rkgld,rktd->rkglt", grouped, keys.astype(np.float64)) * 0.125,
                      -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("rkglt,rktd->rkgld", weights / weights.sum(-1, keepdims=True), values.astype(np.float64))
    np.testing.assert_allclose(np.array(o), want.reshape(q.shape), atol=1e-5, rtol=0)


def test_gather_path_refuses_rows_shorter_than_their_queries(rng):
    ids = fresh_blocks(rng, 4)
    case = make_case(rng, [ids[:1], ids[1:3]], [3, 20], block_size=16)
    q = mx.zeros((2, 8, 4, 64))
    with pytest.raises(ValueError, match="at least its 4 query tokens"):
        paged_prefill_attention(q, case.k_pool, case.v_pool, case.csr, scale=case.scale)


def test_mlx_lm_query_shape_is_accepted(rng):
    case = mixed_batch(rng, block_size=16, group=4)
    o = decode(case, ON, q=case.q[:, :, None, :])
    assert o.shape == (6, 8, 1, 64)
    np.testing.assert_allclose(np.array(o[:, :, 0]), np.array(decode(case, ON)), atol=0, rtol=0)


@pytest.mark.parametrize("where", ["preparing", "launching"])
def test_a_failing_cascade_falls_back_to_flat_in_the_same_step(rng, monkeypatch, caplog, where):
    case = mixed_batch(rng, block_size=16, group=4)
    metrics = OutcomeRecorder()

    def broken(*args, **kwargs):
        raise RuntimeError("injected level-0 fault")

    monkeypatch.setattr(kernels, "prepare_cascade", lambda *a: None)   # the composed levels (portable)
    if where == "preparing":
        monkeypatch.setattr(decode_plan, "prepare_cascade_launch", broken)
    else:
        monkeypatch.setattr(ComposedCascade, "__call__", broken)
    monkeypatch.setattr(decode_plan, "_logged_outcomes", set())
    with caplog.at_level(logging.INFO, logger="mlxcel.engine.decode_plan"):
        o = decode(case, ON, metrics)
        decode(case, ON, metrics)
    np.testing.assert_allclose(np.array(o), np.array(decode(case, OFF)), atol=0, rtol=0)
    assert sample(metrics, "mlxcel_cascade_failures_total") == 2
    assert launches(metrics, "fused_v2") == 2 and launches(metrics, "cascade") == 0
    outcome = metrics.last_outcome
    assert outcome.kind == "cascade_fallback" and outcome.path == "fused_v2"
    assert outcome.plan.spans == MIXED_SPANS and "injected level-0 fault" in outcome.reason
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "injected level-0 fault" in warnings[0].getMessage()


def test_metrics_count_every_launch(rng):
    case = mixed_batch(rng, block_size=16, group=4)
    metrics = OutcomeRecorder()
    for _layer in range(3):
        decode(case, ON, metrics)
    decode(case, OFF, metrics)
    assert launches(metrics, "fused_v2") == 4 and launches(metrics, "cascade") == 3
    assert sample(metrics, "mlxcel_cascade_shared_tokens_total") == 3 * (2 + 3) * 16     # both spans' tokens
    assert sample(metrics, "mlxcel_cascade_member_sequences_total") == 3 * 4            # rows in some span
    assert sample(metrics, "mlxcel_cascade_spans_total") == 3 * 2
    assert sample(metrics, "mlxcel_cascade_failures_total") == 0
    assert metrics.last_outcome.kind == "flat" and metrics.last_outcome.reason == "cascade off"
    # A declined plan still runs fused_v2 and says why.
    decode(case, CascadeConfig(enabled=True, min_shared_pages=6), metrics)
    assert metrics.last_outcome.reason.startswith("best subgroup shares 5 pages < min_shared_pages 6")
    assert launches(metrics, "fused_v2") == 5 and launches(metrics, "cascade") == 3


def test_each_outcome_is_logged_once(rng, monkeypatch, caplog):
    case = mixed_batch(rng, block_size=16, group=4)
    monkeypatch.setattr(decode_plan, "_logged_outcomes", set())
    with caplog.at_level(logging.INFO, logger="mlxcel.engine.decode_plan"):
        for _ in range(3):
            decode(case, ON)
            decode(case, OFF)
    messages = [r.getMessage() for r in caplog.records]
    backend = kernels.backend_name()     # "portable" on the CPU, "cuda" on an NVIDIA GPU
    assert messages == [
        "paged decode v2: fused v2 cascade launch (batch 6, 4 of them sharing 5 pages / 80 KV tokens read once; "
        f"spans: rows [0, 1, 2, 3] pages 0-2, rows [0, 1, 2] pages 2-5; {backend} kernels)",
        f"paged decode v2: fused v2 flat launch (batch 6; cascade off; {backend} kernels)",
    ]


def test_live_config_changes_apply_on_the_next_step(rng):
    case = mixed_batch(rng, block_size=16, group=4)
    config, metrics = CascadeConfig(enabled=False, min_shared_pages=2), OutcomeRecorder()
    decode(case, config, metrics)
    assert metrics.last_outcome.kind == "flat"
    config.update(enabled=True)
    decode(case, config, metrics)
    assert metrics.last_outcome.kind == "cascade"
    config.update(min_shared_pages=6)           # same view, new thresholds: a fresh decision
    decode(case, config, metrics)
    assert metrics.last_outcome.kind == "flat" and "min_shared_pages 6" in metrics.last_outcome.reason


@pytest.mark.parametrize("forest", FORESTS)
@pytest.mark.parametrize("group", [1, 4])
def test_forest_cascade_equals_flat_and_reference(rng, forest, group):
    # Several groups and nested spans in one launch, rows in random order,
    # beside a row entering a shared page mid-page and a one-page row.
    trees, groups, depth = FORESTS[forest]
    case, _ = forest_batch(rng, trees, block_size=16, group=group)
    metrics = OutcomeRecorder()
    cascaded = decode(case, ON, metrics)
    plan = metrics.last_outcome.plan
    assert metrics.last_outcome.kind == "cascade"
    assert (len(plan.levels[0]), plan.depth) == (groups, depth)
    if forest == "a nested node below the thresholds":
        assert plan.levels[1][0].start == plan.levels[0][0].end and plan.levels[1][0].pages == 4
    np.testing.assert_allclose(np.array(cascaded), np.array(decode(case, OFF)), atol=CASCADE_ATOL, rtol=0)
    np.testing.assert_allclose(np.array(cascaded), reference_decode(case.q, case.k_pool, case.v_pool, case.host,
                                                                    case.scale), atol=ATOL, rtol=0)


def counted_launches(monkeypatch):
    """Wraps the backend's prepared partial and merge launches: what was prepared and how often each ran."""
    counts = {"partial": 0, "merge": 0, "prepared": 0}

    def counting(prepare, kind):
        def prepared(*args):
            launch = prepare(*args)
            counts["prepared"] += 1
            return lambda *a: counts.__setitem__(kind, counts[kind] + 1) or launch(*a)
        return prepared
    monkeypatch.setattr(kernels, "prepare_partial", counting(kernels.prepare_partial, "partial"))
    monkeypatch.setattr(kernels, "prepare_merge", counting(kernels.prepare_merge, "merge"))
    monkeypatch.setattr(kernels, "prepare_cascade", lambda *a: None)
    return counts


@pytest.mark.parametrize("groups", [1, 2, 3])
def test_launches_per_step_do_not_grow_with_the_groups(rng, monkeypatch, groups):
    # Each group: 5 pages for 4 rows, 3 more for two of them (depth 2). One
    # partial launch per depth, the private level, one merge: 4 launches a
    # layer however many groups share the step.
    trees = [(5, [(3, [1, 2]), 1, 2])] * groups
    case, _ = forest_batch(rng, trees, block_size=16)
    counts = counted_launches(monkeypatch)
    plan = DecodePlanner().plan(case.csr, ON.snapshot(), shape_of(case))
    assert len(plan.plan.spans) == 2 * groups and plan.plan.depth == 2
    for _layer in range(3):
        o = plan.attend(case.q, case.k_pool, case.v_pool, case.csr.last_page_len)
    assert counts == {"prepared": 4, "partial": 3 * 3, "merge": 3}
    np.testing.assert_allclose(np.array(o), reference_decode(case.q, case.k_pool, case.v_pool, case.host,
                                                             case.scale), atol=ATOL, rtol=0)


def test_a_layout_grew_from_another_only_by_pages_after_each_rows_own():
    old = host_csr([[5, 6, 9], [5, 7]], [40, 20], 16)
    assert grew_from(old, host_csr([[5, 6, 9, 11], [5, 7]], [49, 21], 16))       # a page more, a token more
    assert grew_from(old, old)
    assert not grew_from(old, host_csr([[5, 6, 8], [5, 7]], [40, 20], 16))       # a page replaced
    assert not grew_from(old, host_csr([[5, 6], [5, 7]], [30, 20], 16))          # a page fewer
    assert not grew_from(old, host_csr([[5, 6, 9]], [40], 16))                   # a row gone
    assert not grew_from(old, host_csr([[5, 7], [5, 6, 9]], [20, 40], 16))       # rows reordered
    assert not grew_from(old, host_csr([[5, 6, 9], [5, 7]], [40, 20], 16, [3, 0]))   # a window moved
    builder = CsrBuilder(16)
    first = builder.build("a", [[5, 6, 9], [5, 7]], [40, 20]).structure
    grown = builder.build("b", [[5, 6, 9, 11], [5, 7]], [49, 21]).structure
    other = builder.build("c", [[5, 6, 8], [5, 7]], [40, 20]).structure
    assert grown is not first and grown.lineage is first.lineage and other.lineage is not first.lineage


def test_row_keys_reuse_unchanged_rows_and_give_the_same_layout():
    tables = [[5, 6, 9], [5, 7], [8]]
    tokens = [40, 20, 3]
    keyed, plain = CsrBuilder(16), CsrBuilder(16)
    for step, grown in enumerate([None, 1, 1, 0]):
        if grown is not None:
            tables[grown] = tables[grown] + [20 + step]
            tokens[grown] = (len(tables[grown]) - 1) * 16 + 1
        row_keys = [(row, len(t)) for row, t in enumerate(tables)]     # (sequence, table version)
        a = keyed.build(tuple(row_keys), tables, tokens, row_keys=row_keys).host
        b = plain.build(tuple(row_keys), tables, tokens).host
        for field in ("indptr", "indices", "last_page_len", "first_page_offset"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert a.pages(0).tolist() == [5, 6, 9, 23] and a.pages(1).tolist() == [5, 7, 21, 22]


@pytest.mark.parametrize("seed", range(6))
def test_row_keys_layouts_match_a_full_rebuild_over_random_steps(seed):
    # Sessions decode a token a step (some cross into a fresh page), and now
    # and then one is preempted (new pages), finishes, joins, or re-adopts
    # the same pages under a new version; a table may hold a page more than
    # its tokens need. The keyed builder (each row's table converted once
    # while its key holds) must give a plain build's arrays and lineage.
    gen = np.random.default_rng(seed)
    bs = 4
    fresh = iter(range(1000, 100000))
    shared = [next(fresh) for _ in range(3)]

    def session(sid):
        tokens = int(gen.integers(1, 4 * bs))
        table = shared[:int(gen.integers(0, 4))] + [next(fresh) for _ in range(4)]
        return {"id": sid, "version": 0, "tokens": tokens, "table": table[:-(-tokens // bs) + int(gen.integers(0, 2))]}

    rows = [session(i) for i in range(5)]
    rows = [r for r in rows if len(r["table"]) * bs >= r["tokens"]] or [session(99)]
    for r in rows:
        r["table"] += [next(fresh) for _ in range(-(-r["tokens"] // bs) - len(r["table"]))]
    keyed, plain = CsrBuilder(bs), CsrBuilder(bs)
    kinds = set()
    last = None
    for step in range(60):
        for r in rows:
            r["tokens"] += 1
            if len(r["table"]) * bs < r["tokens"]:
                r["table"] = r["table"] + [next(fresh)]
                r["version"] += 1
        event = gen.integers(0, 10)
        victim = rows[int(gen.integers(0, len(rows)))]
        if event == 0:                                   # preempted and recomputed: other pages
            victim["table"] = [next(fresh) for _ in victim["table"]]
            victim["version"] += 1
        elif event == 1 and len(rows) > 1:               # finished
            rows.remove(victim)
        elif event == 2:                                 # joined
            rows.append(session(100 + step))
            rows[-1]["table"] += [next(fresh) for _ in range(-(-rows[-1]["tokens"] // bs) - len(rows[-1]["table"]))]
        elif event == 3:                                 # the same pages under a new version
            victim["table"] = list(victim["table"])
            victim["version"] += 1
        row_keys = [(r["id"], r["version"]) for r in rows]
        tables, tokens = [r["table"] for r in rows], [r["tokens"] for r in rows]
        key = (tuple(row_keys), tuple(-(-t // bs) for t in tokens))   # a page count moves the key too
        a = keyed.build(key, tables, tokens, row_keys=row_keys)
        b = plain.build(key, tables, tokens)
        for name in ("indptr", "indices", "last_page_len", "first_page_offset"):
            np.testing.assert_array_equal(getattr(a.host, name), getattr(b.host, name))
            assert getattr(a.host, name).dtype == np.int32
        np.testing.assert_array_equal(np.array(a.indices), b.host.indices)
        if last is not None:
            grown = a.structure.lineage is last[0].structure.lineage
            assert grown == (b.structure.lineage is last[1].structure.lineage)
            kinds.add(grown)
        last = a, b
    assert kinds == {True, False}                        # layouts that grew and layouts that did not


def test_a_private_suffix_growing_by_a_page_keeps_the_level_launches(rng, monkeypatch):
    # Staggered sessions cross page boundaries on different steps: the new
    # layout has the same spans, so only the private level is prepared again.
    case, _ = forest_batch(rng, [(5, [(3, [1, 2]), 1, 2])], block_size=16)
    counts = counted_launches(monkeypatch)
    scans = []
    real_decide = cascade.decide
    monkeypatch.setattr(cascade, "decide", lambda *a: scans.append(a) or real_decide(*a))
    builder, planner = CsrBuilder(16), DecodePlanner()
    tables = [case.host.pages(r).tolist() for r in range(case.host.num_rows)]
    tokens = (case.host.num_tokens() + case.host.first_page_offset).tolist()
    offsets = case.host.first_page_offset.tolist()
    first = planner.plan(builder.build("a", tables, tokens, offsets), ON.snapshot(), shape_of(case))
    assert counts["prepared"] == 4                               # two levels, the private one, the merge
    grower = max(range(len(tables)), key=lambda r: len(tables[r]))
    tables[grower] = tables[grower] + [4000]                     # a fresh block (the pool holds 4096)
    tokens[grower] = (len(tables[grower]) - 1) * 16 + 1
    csr = builder.build("b", tables, tokens, offsets)
    second = planner.plan(csr, ON.snapshot(), shape_of(case))
    assert second is not first and second.plan.spans == first.plan.spans
    assert counts["prepared"] == 5                               # the private level only
    assert len(scans) == 1                                       # and the page tables not scanned again
    o = second.attend(case.q, case.k_pool, case.v_pool, csr.last_page_len)
    np.testing.assert_allclose(np.array(o), reference_decode(case.q, case.k_pool, case.v_pool, csr.host,
                                                             case.scale), atol=ATOL, rtol=0)
    # Other spans (a member leaves): everything is prepared anew.
    member = second.plan.spans[0].members[0]
    tables[member] = [3999, 3998]
    tokens[member] = 17
    third = planner.plan(builder.build("c", tables, tokens, offsets), ON.snapshot(), shape_of(case))
    assert third.plan.spans != second.plan.spans and counts["prepared"] == 5 + 2 + third.plan.depth
    assert len(scans) == 2
