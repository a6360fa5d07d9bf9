"""Portable paged attention: MLX ops only, so it runs wherever MLX runs (CPU,
CUDA, Metal).

Rows are cut into page tiles of one common width (split-KV). One gather pulls
every tile's pages straight into a [tiles, Hkv, tokens, D] layout, one matmul
pair computes every tile's softmax state, and the tiles of a row are merged.
Padding slots of short tiles are masked out; the width is picked so padding
stays small (see ``tile_width``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

import mlx.core as mx
import numpy as np

from .csr import HostCsr, PagedCsrView
from .kv_quant import PageGather, Pages, read_scaled
from .shape import AttentionShape, check_inputs

LOG2E = 1.0 / math.log(2.0)


def exp2(x: mx.array) -> mx.array:
    """2**x. Softmax states here live in log2 units, and on MLX's CPU backend
    power(2, x) runs about twice as fast as exp(x) (85 vs 178 ms for 8.5M floats)."""
    return mx.power(2.0, x)

# One extra tile costs about this many page reads (its copy of q, its merge
# slot, its softmax bookkeeping); the width heuristic trades it against padding.
TILE_OVERHEAD_PAGES = 2

CHUNK_PAGES_ENV = "MLXCEL_CHUNK_PAGES"


@dataclass(frozen=True)
class PageTiles:
    """A view's rows cut into tiles of ``width`` pages (layout only; the last
    page's fill comes from each step's last_page_len)."""

    width: int
    pages: mx.array         # [S, 1, width] block ids; padding repeats the tile's first page
    tile_row: mx.array      # [S] row each tile belongs to
    first_slot: mx.array    # [S] first valid token slot (first_page_offset on a row's first tile)
    full_slots: mx.array    # [S] real pages * block_size
    holds_last: mx.array    # [S] 1 where the tile holds its row's last page
    row_indptr: np.ndarray  # [R+1] tiles of each row, contiguous
    one_per_row: bool       # tile s is row s: no q gather, no merge

    @property
    def num_tiles(self) -> int:
        return int(self.row_indptr[-1])


def tile_width(num_pages: np.ndarray) -> int:
    """Pages per tile: the power of two (or the longest row) minimizing page
    reads including padding, plus a per-tile overhead. Equal rows give one
    tile each; a long row among short ones is split to the short rows' width."""
    pages = num_pages[num_pages > 0].astype(np.int64)
    if len(pages) == 0:
        return 1
    longest = int(pages.max())
    candidates = [longest] + [1 << k for k in range(longest.bit_length()) if (1 << k) < longest]

    def cost(width: int) -> int:
        tiles = -(-pages // width)
        return int((tiles * (width + TILE_OVERHEAD_PAGES)).sum())

    return min(candidates, key=lambda w: (cost(w), -w))


def requested_width(chunk_pages: int | None) -> int | None:
    """Explicit tile width: the argument, else MLXCEL_CHUNK_PAGES, else None (heuristic)."""
    if chunk_pages is None:
        text = os.environ.get(CHUNK_PAGES_ENV, "").strip()
        if not text:
            return None
        chunk_pages = int(text)
    if chunk_pages < 1:
        raise ValueError(f"chunk_pages must be >= 1, got {chunk_pages}")
    return chunk_pages


def build_tiles(host: HostCsr, width: int) -> PageTiles:
    pages = host.num_pages().astype(np.int64)
    if len(pages) and width >= pages.max() and pages.min() > 0:
        return row_tiles(host, pages, width)
    return split_tiles(host, pages, width)


def split_tiles(host: HostCsr, pages: np.ndarray, width: int) -> PageTiles:
    """Each row cut into tiles of ``width`` pages (rows without pages get none)."""
    tiles_per_row = -(-pages // width)
    row_indptr = np.zeros(len(pages) + 1, np.int64)
    np.cumsum(tiles_per_row, out=row_indptr[1:])
    tile_row = np.repeat(np.arange(len(pages)), tiles_per_row)
    index_in_row = np.arange(len(tile_row)) - row_indptr[tile_row]
    start = host.indptr[tile_row].astype(np.int64) + index_in_row * width
    real = np.minimum(width, host.indptr[tile_row + 1] - start)
    column = np.arange(width)
    position = np.where(column < real[:, None], start[:, None] + column, start[:, None])
    block_ids = host.indices[position] if len(position) else np.zeros((0, width), np.int32)
    first = np.where(index_in_row == 0, host.first_page_offset[tile_row], 0)
    last = index_in_row == tiles_per_row[tile_row] - 1
    return PageTiles(
        width=width,
        pages=mx.array(block_ids.astype(np.int32)[:, None, :]),
        tile_row=mx.array(tile_row.astype(np.int32)),
        first_slot=mx.array(first.astype(np.int32)),
        full_slots=mx.array((real * host.block_size).astype(np.int32)),
        holds_last=mx.array(last.astype(np.int32)),
        row_indptr=row_indptr,
        one_per_row=bool((tiles_per_row == 1).all()),
    )


def row_tiles(host: HostCsr, pages: np.ndarray, width: int) -> PageTiles:
    """split_tiles where every row is one tile (a private level's or a flat
    step's usual case), in fewer host ops: it runs whenever a layout grows."""
    rows = len(pages)
    column = np.arange(width)
    start = host.indptr[:-1, None]
    position = np.where(column < pages[:, None], start + column, start)
    return PageTiles(
        width=width,
        pages=mx.array(host.indices[position].astype(np.int32, copy=False)[:, None, :]),
        tile_row=mx.arange(rows, dtype=mx.int32),
        first_slot=mx.array(host.first_page_offset.astype(np.int32)),
        full_slots=mx.array((pages * host.block_size).astype(np.int32)),
        holds_last=mx.ones((rows,), dtype=mx.int32),
        row_indptr=np.arange(rows + 1, dtype=np.int64),
        one_per_row=True,
    )


def page_tiles(csr: PagedCsrView, chunk_pages: int | None = None) -> PageTiles:
    """The view's tiles at the requested or heuristic width."""
    return build_tiles(csr.host, requested_width(chunk_pages) or tile_width(csr.host.num_pages()))


def tile_mask(tiles: PageTiles, last_page_len: mx.array, block_size: int) -> mx.array:
    """[S, 1, slots, 1]: which slots of each tile hold one of its row's tokens
    this step (the same in every layer)."""
    if tiles.one_per_row:   # tile s is row s, holding its last page
        end = tiles.full_slots - block_size + last_page_len
    else:
        end = tiles.full_slots - tiles.holds_last * (block_size - last_page_len[tiles.tile_row])
    slot = mx.arange(tiles.width * block_size, dtype=mx.int32)
    valid = (slot >= tiles.first_slot[:, None]) & (slot < end[:, None])
    return valid[:, None, :, None]


def tile_states(q: mx.array, k_pool: Pages, v_pool: Pages, tiles: PageTiles, at: PageGather, mask: mx.array,
                scale: float) -> tuple[mx.array, mx.array]:
    """Softmax state of every tile (``at``: the tiles' pages, ``mask``: tile_mask's): o [S, Hq, D]
    float32 normalized, lse [S, Hq] log2."""
    _, hq, d = q.shape
    hkv = k_pool.shape[2]
    group = hq // hkv
    count = tiles.num_tiles

    q_tiles = q if tiles.one_per_row else q[tiles.tile_row]
    # Scores in log2 units: scale * log2(e) folded into q, so 2**(s - max) is the softmax numerator.
    q_tiles = mx.contiguous((q_tiles.astype(mx.float32) * (scale * LOG2E)).reshape(count, hkv, group, d))
    # Gathered as [S, Hkv, W * block, D] (PageGather's rows): each head's
    # tokens land contiguous, so the matmuls need no transposed copy.
    # A quantized pool's codes are gathered and dequantized here, in float32;
    # int8's token scales multiply the scores and the softmax weights instead.
    keys, key_scales = read_scaled(k_pool, at)
    values, value_scales = read_scaled(v_pool, at)

    # Scores transposed, [S, Hkv, slots, G]: keys @ q^T is the faster matmul
    # orientation on reference BLAS (no dot-product inner loop) and no slower elsewhere.
    scores = keys @ q_tiles.swapaxes(-1, -2)
    if key_scales is not None:
        scores = scores * key_scales                             # [S, Hkv, slots, 1]
    scores = mx.where(mask, scores, -mx.inf)

    top = scores.max(axis=-2, keepdims=True)                     # finite: every tile has a token
    weights = exp2(scores - top)
    total = weights.sum(axis=-2, keepdims=True)                  # [S, Hkv, 1, G]
    if value_scales is not None:
        weights = weights * value_scales
    o = (weights.swapaxes(-1, -2) @ values) / total.swapaxes(-1, -2)
    lse = top + mx.log2(total)
    return o.reshape(count, hq, d), lse.reshape(count, hq)


@dataclass(frozen=True)
class MergeLayout:
    """Where each group's states sit (host work done once per layout)."""

    groups: int
    widest: int              # most states in a group
    order: mx.array | None   # every group one state: which one (a copy, no arithmetic)
    slot: mx.array | None    # [M, K] state of each group's k-th entry
    present: mx.array | None  # [M, K, 1] whether that entry exists

    def arrays(self) -> tuple[mx.array, ...]:
        """The layout's arrays, in ``rebind``'s order (a trace's inputs: see PartialLaunch)."""
        return tuple(a for a in (self.order, self.slot, self.present) if a is not None)

    def rebind(self, arrays) -> "MergeLayout":
        if self.order is not None:
            return replace(self, order=arrays[0])
        return replace(self, slot=arrays[0], present=arrays[1]) if arrays else self

    @property
    def signature(self) -> tuple:
        return self.groups, self.widest, self.order is not None


def merge_layout(o_indptr) -> MergeLayout:
    indptr = np.asarray(o_indptr, dtype=np.int64)
    sizes = np.diff(indptr)
    groups = len(sizes)
    widest = int(sizes.max()) if groups else 0
    if widest == 0:
        return MergeLayout(groups, 0, None, None, None)
    if (sizes == 1).all():
        return MergeLayout(groups, 1, mx.array(indptr[:-1].astype(np.int32)), None, None)
    column = np.arange(widest)
    present = column < sizes[:, None]
    slot = np.where(present, indptr[:-1, None] + column, 0).astype(np.int32)
    return MergeLayout(groups, widest, None, mx.array(slot), mx.array(present)[:, :, None])


def merge_with(v_in: mx.array, lse_in: mx.array, layout: MergeLayout) -> tuple[mx.array, mx.array]:
    """Merge groups of states laid out by ``layout``: v [M, H, D] float32, lse [M, H] log2.
    A state with lse -inf weighs 0; a group with no weight gives v 0, lse -inf."""
    heads, d = v_in.shape[1], v_in.shape[2]
    if layout.widest == 0:
        return (mx.zeros((layout.groups, heads, d), mx.float32),
                mx.full((layout.groups, heads), -mx.inf, mx.float32))
    if layout.order is not None:
        return v_in[layout.order].astype(mx.float32), lse_in[layout.order].astype(mx.float32)
    lse = mx.where(layout.present, lse_in[layout.slot].astype(mx.float32), -mx.inf)  # [M, K, H]
    top = lse.max(axis=1, keepdims=True)
    top = mx.where(top == -mx.inf, 0.0, top)
    weights = exp2(lse - top)                                        # -inf -> 0
    total = weights.sum(axis=1)                                      # [M, H]
    mixed = mx.where(weights[..., None] > 0, weights[..., None] * v_in[layout.slot].astype(mx.float32), 0.0)
    v = mixed.sum(axis=1) / mx.where(total > 0, total, 1.0)[..., None]
    return v, top[:, 0] + mx.log2(total)


def merge_states(v_in: mx.array, lse_in: mx.array, o_indptr) -> tuple[mx.array, mx.array]:
    """Merge groups of contiguous states (see merge_with)."""
    return merge_with(v_in, lse_in, merge_layout(o_indptr))


@dataclass(frozen=True)
class MergeLaunch:
    """merge_states over one layout of groups, built once: called with (v_in, lse_in). Traceable as
    PartialLaunch is."""

    layout: MergeLayout

    def __call__(self, v_in: mx.array, lse_in: mx.array) -> tuple[mx.array, mx.array]:
        return merge_with(v_in, lse_in, self.layout)

    def arrays(self) -> tuple[mx.array, ...]:
        return self.layout.arrays()

    def rebind(self, arrays) -> "MergeLaunch":
        return MergeLaunch(self.layout.rebind(arrays))

    @property
    def signature(self) -> tuple:
        return type(self).__name__, self.layout.signature


def prepare_merge(o_indptr, head_dim: int) -> MergeLaunch:
    """merge_states over these groups, their layout built once."""
    return MergeLaunch(merge_layout(o_indptr))


def no_states(rows: int, q: mx.array) -> tuple[mx.array, mx.array]:
    """The states of rows that attend to nothing: v 0, lse -inf."""
    hq, d = q.shape[1], q.shape[2]
    return mx.zeros((rows, hq, d), mx.float32), mx.full((rows, hq), -mx.inf, mx.float32)


@dataclass(frozen=True)
class PartialLaunch:
    """paged_attention_partial over one page layout, its host work done:
    called with each step's (q, k_pool, v_pool, last_page_len). The layers of
    a step pass one last_page_len: its tile mask is built once, for all.

    A trace of it (``mx.compile``, a whole decoder layer in the engine) takes
    its ``arrays()`` as inputs and calls ``rebind(arrays)``: the trace then
    depends only on ``signature`` (what the ops bake in besides the arrays'
    shapes), so the next layout of the same signature replays it."""

    tiles: PageTiles
    merge: MergeLayout | None   # None: one tile per row
    shape: AttentionShape
    rows: int
    at: PageGather              # the tiles' pages, for every layer's gathers
    _mask: list = field(default_factory=lambda: [None, None], compare=False, repr=False)  # [last_page_len, mask]

    def __call__(self, q: mx.array, k_pool: mx.array, v_pool: mx.array,
                 last_page_len: mx.array) -> tuple[mx.array, mx.array]:
        if self.tiles.num_tiles == 0:
            return no_states(self.rows, q)
        if self._mask[0] is not last_page_len:
            self._mask[:] = last_page_len, tile_mask(self.tiles, last_page_len, self.shape.block_size)
        o, lse = tile_states(q, k_pool, v_pool, self.tiles, self.at, self._mask[1], self.shape.scale)
        return (o, lse) if self.merge is None else merge_with(o, lse, self.merge)

    def arrays(self) -> tuple[mx.array, ...]:
        """The layout's arrays, in ``rebind``'s order (the merge's last, where there is one)."""
        t = self.tiles
        merged = () if self.merge is None else self.merge.arrays()
        return (self.at.pages, self.at.rows, t.tile_row, t.first_slot, t.full_slots, t.holds_last, *merged)

    def rebind(self, arrays) -> "PartialLaunch":
        """The same launch over ``arrays`` (``arrays()``'s order and shapes)."""
        pages, rows, tile_row, first_slot, full_slots, holds_last, *merged = arrays
        tiles = replace(self.tiles, pages=pages, tile_row=tile_row, first_slot=first_slot, full_slots=full_slots,
                        holds_last=holds_last)
        merge = None if self.merge is None else self.merge.rebind(merged)
        return PartialLaunch(tiles, merge, self.shape, self.rows, PageGather(pages, rows))

    @property
    def signature(self) -> tuple:
        t = self.tiles
        merging = None if self.merge is None else self.merge.signature
        return type(self).__name__, self.shape, self.rows, t.num_tiles, t.width, t.one_per_row, merging


def prepare_partial(csr: PagedCsrView, shape: AttentionShape, chunk_pages: int | None = None) -> PartialLaunch:
    tiles = page_tiles(csr, chunk_pages)
    merge = None if tiles.one_per_row or tiles.num_tiles == 0 else merge_layout(tiles.row_indptr)
    return PartialLaunch(tiles, merge, shape, csr.num_rows, PageGather.of(tiles.pages, shape.block_size,
                                                                          shape.kv_heads))


def paged_attention_partial(q: mx.array, k_pool: mx.array, v_pool: mx.array, csr: PagedCsrView,
                            *, scale: float, chunk_pages: int | None = None) -> tuple[mx.array, mx.array]:
    check_inputs(q, k_pool, csr)
    launch = prepare_partial(csr, AttentionShape.of(q, k_pool, scale), chunk_pages)
    return launch(q, k_pool, v_pool, csr.last_page_len)


def dense_attention(q: mx.array, keys: mx.array, values: mx.array, mask: mx.array, *, scale: float) -> mx.array:
    """Masked attention over contiguous K/V: q [R, Hq, L, D], keys/values
    [R, Hkv, T, D], mask [R, 1, L, T] (True = visible) -> [R, Hq, L, D] in q's dtype.
    The matmul-softmax-matmul that MLX's CPU scaled_dot_product_attention runs
    unfused anyway, with the softmax in base 2 (see exp2): ~1.45x faster here."""
    rows, hq, length, d = q.shape
    hkv, tokens = keys.shape[1], keys.shape[2]
    group = hq // hkv
    q_kv = (q.astype(mx.float32) * (scale * LOG2E)).reshape(rows, hkv, group * length, d)
    scores = (q_kv @ keys.astype(mx.float32).swapaxes(-1, -2)).reshape(rows, hkv, group, length, tokens)
    scores = mx.where(mask[:, :, None], scores, -mx.inf)
    weights = exp2(scores - scores.max(axis=-1, keepdims=True))  # every query sees at least itself
    o = (weights.reshape(rows, hkv, group * length, tokens) @ values.astype(mx.float32))
    o = o.reshape(rows, hkv, group, length, d) / weights.sum(axis=-1, keepdims=True)
    return o.reshape(rows, hq, length, d).astype(q.dtype)
