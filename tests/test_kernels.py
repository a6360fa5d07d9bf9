"""Paged partial kernel and state merge against the float64 NumPy reference."""

from __future__ import annotations

import logging

import mlx.core as mx
import numpy as np
import pytest

from mlxcel import kernels
from mlxcel.kernels import PagedCsrView, merge_states, paged_attention_partial, portable
from mlxcel.kernels import csr as csr_module
from mlxcel.kernels.csr import HostCsr, host_csr
from mlxcel.kernels.reference import reference_merge, reference_partial
from paged_cases import ATOL, fresh_blocks, kernel_atol, make_case, mixed_batch


def assert_matches_reference(case, o, lse, atol=ATOL):
    ref_o, ref_lse = reference_partial(case.q, case.k_pool, case.v_pool, case.host, case.scale)
    assert o.dtype == mx.float32 and lse.dtype == mx.float32
    assert o.shape == case.q.shape and lse.shape == case.q.shape[:2]
    np.testing.assert_allclose(np.array(o), ref_o, atol=atol, rtol=0)
    np.testing.assert_allclose(np.array(lse), ref_lse, atol=atol, rtol=0)


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
def test_partial_matches_reference(rng, group, head_dim, block_size):
    # Mixed lengths, partially filled last pages, first pages entered mid-page.
    case = mixed_batch(rng, block_size=block_size, group=group, head_dim=head_dim)
    o, lse = paged_attention_partial(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale)
    assert_matches_reference(case, o, lse)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_half_precision_pools_accumulate_in_float32(rng, dtype):
    # The reference reads the same rounded pool values in float64, so only the
    # kernel's float32 accumulation separates them (and, for the fused GPU
    # kernels, their 16-bit matrix operands: see kernel_atol).
    case = mixed_batch(rng, block_size=16, group=4, head_dim=128, dtype=dtype)
    o, lse = paged_attention_partial(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale)
    assert_matches_reference(case, o, lse, kernel_atol(dtype))


def long_row_case(rng, block_size=16):
    ids = fresh_blocks(rng, 60)
    tables = [ids[:40], ids[40:43], ids[43:45], ids[45:49]]
    tokens = [39 * block_size + 7, 2 * block_size + 1, 2 * block_size, 3 * block_size + 9]
    return make_case(rng, tables, tokens, block_size=block_size, group=4, head_dim=64,
                     first_page_offset=[5, 0, 3, 0], num_blocks=60)


def test_heuristic_splits_a_long_row_among_short_ones(rng):
    case = long_row_case(rng)
    tiles = portable.page_tiles(case.csr)
    assert tiles.width < 40 and tiles.num_tiles > case.host.num_rows
    o, lse = paged_attention_partial(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale)
    assert_matches_reference(case, o, lse)


@pytest.mark.parametrize("chunk_pages", [1, 3, 7, 64])
def test_explicit_chunk_sizes_match_reference(rng, chunk_pages):
    case = long_row_case(rng)
    o, lse = paged_attention_partial(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale,
                                     chunk_pages=chunk_pages)
    assert portable.page_tiles(case.csr, chunk_pages).width == chunk_pages
    assert_matches_reference(case, o, lse)


@pytest.mark.parametrize("seed", range(5))
def test_one_tile_per_row_gives_the_split_tiles_arrays(seed):
    gen = np.random.default_rng(seed)
    rows = int(gen.integers(1, 9))
    pages = gen.integers(1, 7, rows)
    tables = [gen.permutation(200)[:n].tolist() for n in pages]
    offsets = gen.integers(0, 8, rows)
    host = host_csr(tables, [(n - 1) * 16 + int(gen.integers(9, 17)) for n in pages], 16, offsets)
    for width in (int(pages.max()), int(pages.max()) + 3):
        fast, split = portable.row_tiles(host, pages, width), portable.split_tiles(host, pages, width)
        assert fast.width == split.width and fast.one_per_row and split.one_per_row
        np.testing.assert_array_equal(fast.row_indptr, split.row_indptr)
        for name in ("pages", "tile_row", "first_slot", "full_slots", "holds_last"):
            a, b = getattr(fast, name), getattr(split, name)
            assert a.dtype == b.dtype == mx.int32 and a.shape == b.shape
            np.testing.assert_array_equal(np.array(a), np.array(b))


def test_chunk_env_override(rng, monkeypatch):
    monkeypatch.setenv("MLXCEL_CHUNK_PAGES", "5")
    case = long_row_case(rng)
    o, lse = paged_attention_partial(case.q, case.k_pool, case.v_pool, case.csr, scale=case.scale)
    assert portable.page_tiles(case.csr).width == 5
    assert_matches_reference(case, o, lse)


def test_tile_width_heuristic():
    assert portable.tile_width(np.array([72] * 8)) == 72          # equal rows: one tile each
    assert portable.tile_width(np.array([8, 8, 8, 8, 72, 72, 72, 72])) == 8
    assert portable.tile_width(np.array([200, 2, 2, 2])) < 200
    assert portable.tile_width(np.array([0, 0])) == 1


def test_empty_row_is_a_zero_weight_state(rng):
    # host_csr refuses rows without tokens, so the empty middle row is built by hand.
    ids = fresh_blocks(rng, 8)
    host = HostCsr(np.array([0, 3, 3, 5], np.int32), np.array(ids[:5], np.int32),
                   np.array([8, 1, 4], np.int32), np.zeros(3, np.int32), 16)
    case = make_case(rng, [ids[:8]], [8 * 16], block_size=16)
    csr = PagedCsrView.from_host(host)
    q = mx.concatenate([case.q] * 3)
    o, lse = paged_attention_partial(q, case.k_pool, case.v_pool, csr, scale=case.scale)
    assert np.array(lse)[1].tolist() == [-np.inf] * q.shape[1]
    assert not np.isnan(np.array(o)).any() and (np.array(o)[1] == 0).all()
    # Merged with a real state it weighs nothing: the result is that state exactly.
    v, merged = merge_states(o[:2], lse[:2], np.array([0, 2]))
    np.testing.assert_array_equal(np.array(v)[0], np.array(o)[0])
    np.testing.assert_array_equal(np.array(merged)[0], np.array(lse)[0])


def test_merge_matches_reference_with_empty_and_single_groups(rng):
    count, heads, d = 9, 6, 32
    v_in = rng.standard_normal((count, heads, d)).astype(np.float32)
    lse_in = (rng.standard_normal((count, heads)) * 4).astype(np.float32)
    lse_in[2, :3] = -np.inf                    # some states with no tokens
    v_in[2, :3] = np.nan                       # whose output must not leak
    indptr = np.array([0, 0, 1, 4, 6, 9])      # groups of 0, 1, 3, 2, 3
    v, lse = merge_states(mx.array(v_in), mx.array(lse_in), indptr)
    ref_v, ref_lse = reference_merge(v_in, lse_in, indptr)
    assert not np.isnan(np.array(v)).any()
    np.testing.assert_allclose(np.array(v), ref_v, atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.array(lse), ref_lse, atol=ATOL, rtol=0)
    assert (np.array(lse)[0] == -np.inf).all() and (np.array(v)[0] == 0).all()
    np.testing.assert_array_equal(np.array(v)[1], v_in[0])     # a group of one is the identity


def test_merging_disjoint_ranges_equals_the_whole_range(rng):
    # The split-KV and cascade algebra: states over disjoint page ranges of a
    # row merge into the state over the whole row.
    ids = fresh_blocks(rng, 12)
    whole = make_case(rng, [ids[:9]], [8 * 16 + 5], block_size=16, group=8, head_dim=128, first_page_offset=[3])
    parts = host_csr([ids[:4], ids[4:6], ids[6:9]], [4 * 16, 2 * 16, 2 * 16 + 5], 16, [3, 0, 0])
    q = mx.concatenate([whole.q] * 3)
    o, lse = paged_attention_partial(q, whole.k_pool, whole.v_pool, PagedCsrView.from_host(parts), scale=whole.scale)
    v, merged = merge_states(o, lse, [0, 3])
    ref_o, ref_lse = reference_partial(whole.q, whole.k_pool, whole.v_pool, whole.host, whole.scale)
    np.testing.assert_allclose(np.array(v), ref_o, atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.array(merged), ref_lse, atol=ATOL, rtol=0)


def test_backend_dispatch(monkeypatch, caplog):
    monkeypatch.setattr(kernels, "_gpu_platform", lambda: None)     # a CPU, whatever runs the suite
    monkeypatch.setenv("MLXCEL_KERNELS", "portable")
    assert kernels.backend() is portable
    monkeypatch.setattr(kernels, "_warned", set())
    monkeypatch.setenv("MLXCEL_KERNELS", "fused")
    with caplog.at_level(logging.WARNING, logger="mlxcel.kernels"):
        assert kernels.backend() is portable     # no fused kernels registered for the CPU
        assert kernels.backend() is portable
    assert len([r for r in caplog.records if "MLXCEL_KERNELS" in r.getMessage()]) == 1


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_a_steps_small_arrays_travel_as_one_upload(rng, device):
    # Each array comes back as it was given (shape, int32 values): where the default device is a GPU all views
    # of one device buffer (one array made), on the CPU each its own (an array there costs less than a view).
    parts = [rng.integers(-5, 1000, n).astype(np.int32) for n in (7, 0, 33)] + [rng.integers(0, 9, (4, 5))]
    made = []
    real_array = mx.array
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(csr_module.mx, "default_device", lambda: mx.Device(getattr(mx.DeviceType, device)))
        patch.setattr(csr_module.mx, "array", lambda *a, **k: made.append(1) or real_array(*a, **k))
        views = csr_module.upload(*parts)
    assert len(made) == (1 if device == "gpu" else len(parts))
    for part, view in zip(parts, views):
        assert view.dtype == mx.int32 and view.shape == part.shape
        np.testing.assert_array_equal(np.array(view), part)
