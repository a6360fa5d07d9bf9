"""Launch planning of the fused GPU kernels (host side, runs on the CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from mlxcel.kernels import PagedCsrView
from mlxcel.kernels.csr import host_csr
from mlxcel.kernels.tile_plan import (LEVEL0_MAX_WARPS_M, LEVEL0_TARGET_BLOCKS, MIN_TILE_TOKENS, TARGET_BLOCKS,
                                      TOKENS_PER_HEAD, WAVE_FILL, fused_tiles, head_layout, plan_tiles, split_rows,
                                      tile_width, wave_width)


def random_host(rng, rows=7, block_size=16):
    pages = rng.integers(1, 40, rows)
    ids = rng.permutation(int(pages.sum()) + 5)
    tables, at = [], 0
    for p in pages:
        tables.append(ids[at: at + p].tolist())
        at += p
    tokens = [(p - 1) * block_size + int(rng.integers(1, block_size + 1)) for p in pages]
    offsets = [int(rng.integers(0, min(t, block_size))) if i % 2 else 0 for i, t in enumerate(tokens)]
    return host_csr(tables, tokens, block_size, offsets)


@pytest.mark.parametrize("width", [1, 2, 5, 16, 64])
def test_tiles_cover_every_page_once_in_order(width):
    rng = np.random.default_rng(width)
    host = random_host(rng)
    geometry, row_indptr = split_rows(host, width)
    for row in range(host.num_rows):
        tiles = geometry[row_indptr[row]: row_indptr[row + 1]]
        assert (tiles[:, 0] == row).all()
        pages = np.concatenate([host.indices[b: b + n] for _, b, n, _, _ in tiles])
        np.testing.assert_array_equal(pages, host.pages(row))
        lengths = tiles[:, 2]
        assert lengths.max() <= width and lengths.max() - lengths.min() <= 1   # balanced, no short tail tile
        # first_page_offset applies to a row's first tile only; the last tile holds the partial page.
        assert tiles[0, 3] == host.first_page_offset[row] and (tiles[1:, 3] == 0).all()
        assert tiles[-1, 4] == 1 and (tiles[:-1, 4] == 0).all()


def test_plan_flags_one_tile_per_row():
    host = random_host(np.random.default_rng(0))
    assert plan_tiles(host, 64).one_per_row
    plan = plan_tiles(host, 3)
    assert not plan.one_per_row and plan.num_tiles == int((-(-host.num_pages() // 3)).sum())
    np.testing.assert_array_equal(np.array(plan.row_indptr_device), plan.row_indptr)


def test_width_keeps_long_batches_whole_and_splits_one_long_row():
    # 64 rows of 33K tokens, 8 KV heads: 512 blocks per tile-per-row, about a wave: no split needed.
    assert tile_width(np.full(64, 1056), 8, 32, target_blocks=512) == 1056
    # Cascade level 0: one row of 256 pages, 16 blocks per tile: split to offer TARGET_BLOCKS.
    width = tile_width(np.array([256]), 16, 32)
    tiles = -(-256 // width)
    assert tiles * 16 >= TARGET_BLOCKS or width * 32 == MIN_TILE_TOKENS
    assert width * 32 >= MIN_TILE_TOKENS


def test_level0_layout_and_widths_are_the_measured_best():
    # The H200 sweep of the level-0 warps_m cap against the tile width: with two
    # head-splitting warps, 8192 x 32 -> 32 pages (0.073 ms), 8192 x 64 -> 64
    # (0.116), 32768 x 32 -> 128 (0.155), 2048 x 64 -> 16 (0.075).
    for shared_pages, members, best in ((256, 32, 32), (256, 64, 64), (1024, 32, 128), (64, 64, 16)):
        layout = head_layout(members * 4, 4, LEVEL0_MAX_WARPS_M)
        assert layout.warps_m == 2
        csr = PagedCsrView.from_host(host_csr([list(range(shared_pages))], [shared_pages * 32], 32))
        plan = fused_tiles(csr, None, layout, 8, LEVEL0_TARGET_BLOCKS)
        assert np.array(plan.geometry)[:, 2].max() == best


def test_width_never_goes_below_the_minimum_tile_unless_rows_are_shorter():
    assert tile_width(np.array([72] * 4), 8, 32) * 32 >= MIN_TILE_TOKENS
    assert tile_width(np.array([3, 2]), 1, 32) == 3              # shorter than the minimum: one tile per row
    assert tile_width(np.array([0, 0]), 8, 32) == 1


def test_width_is_the_widest_that_reaches_the_target():
    pages = np.array([100, 37, 250, 8])
    width = tile_width(pages, 4, 64, target_blocks=200)   # minimum tile: 4 pages
    count = lambda w: int((-(-pages // w)).sum())   # noqa: E731
    assert width > 4 and count(width) * 4 >= 200 and count(width + 1) * 4 < 200


def test_transposed_launches_are_cut_into_whole_waves():
    # 32 rows of 258 pages, 8 KV heads: 3 tiles a row (TARGET_BLOCKS' cut) are 768 blocks, 1.16 waves of the
    # int8 kernel's 660 slots (five blocks an SM); 2 tiles fill 0.78 of a wave (5 would fill 0.97 of two: the
    # fewest tiles filling 3/4 win). At four an SM (int4, 528 slots) two tiles a row fill 0.97 of a wave.
    pages = np.full(32, 258)
    assert tile_width(pages, 8, 32) == 128
    assert wave_width(pages, 8, 32, resident=5) == 129
    assert wave_width(pages, 8, 32, resident=4) == 129
    # One tile a row that fills a wave to 3/4 stays whole.
    assert wave_width(np.full(62, 258), 8, 32, resident=5) == 258          # 496 blocks, 0.75 of 660
    assert wave_width(np.full(50, 258), 8, 32, resident=5) == 86           # 400 blocks, 0.61; 3 tiles 0.91 of two
    # Any rows: the chosen width is the widest filling WAVE_FILL of its waves, else the best filled.
    rng = np.random.default_rng(5)
    for _ in range(40):
        pages = rng.integers(1, 600, rng.integers(1, 40))
        width = wave_width(pages, 8, 32, resident=5)
        slots = 5 * 132

        def fill(w):
            blocks = int((-(-pages // w)).sum()) * 8
            return blocks / (-(-blocks // slots) * slots), blocks
        longest = int(pages.max())
        candidates = [-(-longest // k) for k in range(1, longest // 8 + 1)]
        candidates = [w for w in candidates if w == longest or fill(w)[1] <= 2 * slots]
        assert width in candidates
        filled = [w for w in candidates if fill(w)[0] >= WAVE_FILL]
        if filled:
            assert width == max(filled)
        else:
            assert fill(width)[0] >= max(fill(w)[0] for w in candidates)


def test_waves_keep_long_batches_whole_and_short_rows_at_the_minimum():
    assert wave_width(np.full(80, 1056), 8, 32, resident=5) == 1056          # 640 blocks: no merge
    assert wave_width(np.array([256]), 8, 32, resident=5) * 32 == MIN_TILE_TOKENS   # one row: every SM it can
    assert wave_width(np.array([3, 2]), 8, 32, resident=5) == 3
    assert wave_width(np.array([0, 0]), 8, 32, resident=5) == 1


def test_chunk_pages_overrides_the_tile_width(monkeypatch):
    host = random_host(np.random.default_rng(3))
    csr = PagedCsrView.from_host(host)
    layout = head_layout(4, 4)
    assert fused_tiles(csr, 3, layout, 8).geometry.shape[0] == int((-(-host.num_pages() // 3)).sum())
    monkeypatch.setenv("MLXCEL_CHUNK_PAGES", "2")
    assert np.array_equal(np.array(fused_tiles(csr, None, layout, 8).geometry),
                          np.array(fused_tiles(csr, 2, layout, 8).geometry))


def test_many_stacked_heads_get_longer_tiles():
    # Partial states grow with the heads; tiles keep >= TOKENS_PER_HEAD tokens per head.
    host = host_csr([list(range(256))], [256 * 32], 32)
    csr = PagedCsrView.from_host(host)
    few, many = fused_tiles(csr, None, head_layout(16, 4), 8), fused_tiles(csr, None, head_layout(256, 4), 8)
    assert np.array(many.geometry)[:, 2].min() * 32 >= TOKENS_PER_HEAD * 256
    assert many.num_tiles < few.num_tiles


@pytest.mark.parametrize("heads, warps, warps_m, groups", [
    (1, 4, 1, 1), (4, 4, 1, 1), (16, 4, 1, 1), (17, 4, 2, 1), (32, 4, 2, 1), (48, 4, 4, 1),
    (64, 4, 4, 1), (128, 4, 4, 2), (256, 4, 4, 4), (100, 2, 2, 4), (8, 2, 1, 1),
])
def test_head_layout(heads, warps, warps_m, groups):
    layout = head_layout(heads, warps)
    assert (layout.warps_m, layout.groups) == (warps_m, groups)
    assert layout.groups * layout.warps_m * 16 >= heads > (layout.groups - 1) * layout.warps_m * 16


@pytest.mark.parametrize("cap, warps_m, groups", [(None, 4, 2), (4, 4, 2), (2, 2, 4), (1, 1, 8), (8, 4, 2)])
def test_head_layout_cap(cap, warps_m, groups):
    # 128 stacked heads on 4 warps: a cap on the head-splitting warps trades them for head groups.
    layout = head_layout(128, 4, cap)
    assert (layout.warps_m, layout.groups) == (warps_m, groups)
    assert layout.warps_m * layout.groups * 16 >= 128
