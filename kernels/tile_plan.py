"""Launch planning shared by the fused GPU kernels (CUDA and Metal).

A launch of the paged partial kernel runs one thread block per (page tile,
head group, KV head). This module decides, on the host and from the page
layout alone, how rows are cut into page tiles (split-KV) and how a KV head's
query heads are spread over a block's warps. Both GPU backends read the same
plan, so the kernels differ only in the platform's spelling.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .csr import HostCsr, PagedCsrView, upload
from .kv_quant import KVQuant
from .portable import requested_width

HEADS_PER_WARP = 16       # query heads one warp owns: the M side of a 16-row matrix tile

# Blocks one launch should offer so the GPU stays busy: about four per
# multiprocessor on a 132-SM H200 (three are resident at a time at D=128,
# limited by staging memory and registers; the fourth smooths the tail).
# Fewer, longer tiles would leave SMs idle; more tiles cost partial-state
# traffic and a wider merge.
TARGET_BLOCKS = 528

# Quantized pages under at most this many query heads a block run the partial
# kernel's products transposed (CUDA's HEADS_ON_N: the heads an n8 tile's
# columns, not rows of an m16 tile): at D = 128 int8's kernel holds 94
# registers a lane, five blocks an SM, int4's 127, four (D = 64: seven and
# six); the m16 kernels hold three (tests/test_fused_sources.py).
TRANSPOSED_MAX_HEADS = 8
MULTIPROCESSORS = 132     # an H100's or H200's (SXM)
# A transposed launch's cut is the fewest tiles a row whose blocks fill this
# much of their waves (wave_width).
WAVE_FILL = 0.75

# Cascade level 0 (many stacked heads, one long row) wants fewer: every
# extra tile adds its heads' partial states to write and fold. Measured on the
# H200 (8192 shared x 32 and x 64, 32768 x 32) with 4-warp blocks: the best
# tile width gave 256 blocks, about two per multiprocessor, in each of the
# three cells; the later sweep with two head-splitting warps still puts the
# best at 256 (8192 x 32: 0.075 ms, against 0.092 at 512 blocks and 0.085 at
# 128). Counted in blocks of the platform's warps: a level-0 launch with
# bigger blocks gets proportionally fewer.
LEVEL0_TARGET_BLOCKS = 256

# Level 0's warps that split heads (the others split tokens): at most two.
# Four take 176 registers a lane at D=128 (two blocks per SM), two take 164
# (three). Measured on the H200 (the warps_m cap x tile width sweep): 8192 x 32 0.073-0.077 ms against
# 0.083-0.084 uncapped, 2048 x 64 0.075 against 0.088, 8192 x 64 even
# (0.116 / 0.118); 32768 x 32 loses 6% (0.155 against 0.146).
LEVEL0_MAX_WARPS_M = 2

# int4 pages cap it at one: at two the kernel takes 170 registers a lane at
# D=128 (the int4 values' scale and zero pairs, the two-warp layout's 32-token
# softmax steps; 168 would allow three blocks), and two such blocks leave no
# room for the level-1 block launched beside them; at one it takes 164, three
# blocks as the float and int8 layouts (tests/test_fused_sources.py). The head groups double, each
# reading the tile's codes from L2.
LEVEL0_MAX_WARPS_M_INT4 = 1


def level0_max_warps_m(quant: KVQuant | None = None) -> int:
    """Level 0's cap on head-splitting warps for pages of this format (None: float pages)."""
    return LEVEL0_MAX_WARPS_M_INT4 if quant is not None and quant.affine else LEVEL0_MAX_WARPS_M

# The shortest tile worth a block: below it a block spends more on its
# prologue, its Q fragments and its merge slot than on reading KV.
MIN_TILE_TOKENS = 256

# A tile's partial states (heads x D floats per KV head) should stay a
# fraction of the K/V it reads (tokens x D x two 16-bit values): at least this
# many tokens per query head, states at most half the K/V bytes. Measured on
# the H200 at 2048 shared x 64 (256 stacked heads): 16-page tiles 0.091 ms,
# the 32 pages that 4 tokens per head forced 0.123 ms.
TOKENS_PER_HEAD = 2

GEOMETRY_FIELDS = 5       # row, first page (index into csr.indices), pages, first valid slot, holds last page


@dataclass(frozen=True)
class HeadLayout:
    """How the query heads of one KV head map onto warps.

    ``warps_m`` of a block's warps split the heads into 16-head matrix tiles;
    the other ``warps // warps_m`` split each staged chunk's tokens (their states are
    merged inside the block). Heads beyond ``warps_m * 16`` go to further
    head groups, each a block of its own over the same tile (whose KV then
    comes from L2: their blocks are launched next to each other).
    """

    heads: int        # query heads per KV head in this launch (G, or M * G when stacked)
    warps_m: int      # a power of two, at most the block's warps
    groups: int       # head groups per (tile, KV head)
    warps: int        # the block's warps
    warpgroup: bool = False   # warpgroups of 64 rows run the block (a CUDA stacked level on warpgroup MMA)


def transposed(heads: int, quant: KVQuant | None, stacked: bool) -> bool:
    """Whether a partial launch of ``heads`` query heads a KV head runs its products transposed."""
    return quant is not None and not stacked and heads <= TRANSPOSED_MAX_HEADS


def transposed_resident_blocks(quant: KVQuant, head_dim: int) -> int:
    """Blocks of a transposed launch resident on a multiprocessor, by its
    registers and staging memory (tests/test_fused_sources.py): at D = 128
    int8 five, int4 four; at D = 64 (72 and 75 registers a lane) seven and six."""
    if head_dim <= 64:
        return 6 if quant.affine else 7
    return 4 if quant.affine else 5


def head_layout(heads: int, warps: int, max_warps_m: int | None = None) -> HeadLayout:
    """``max_warps_m`` caps the warps that split heads (benchmark sweeps):
    fewer head-splitting warps per block means more head groups, so more
    blocks over the same tiles."""
    if heads < 1:
        raise ValueError(f"need at least one query head per KV head, got {heads}")
    m_tiles = -(-heads // HEADS_PER_WARP)
    warps_m = 1
    while warps_m < min(m_tiles, warps, max_warps_m or warps):
        warps_m *= 2
    return HeadLayout(heads, warps_m, -(-m_tiles // warps_m), warps)


@dataclass(frozen=True)
class TilePlan:
    """A view's rows cut into page tiles (layout only: the last page's fill is
    read by the kernel from each step's last_page_len)."""

    geometry: mx.array      # [S, GEOMETRY_FIELDS] int32, tiles of a row contiguous and in order
    row_indptr: np.ndarray  # [R+1] tiles of each row
    row_indptr_device: mx.array
    one_per_row: bool       # tile s is row s: the kernel's states are the rows' states

    @property
    def num_tiles(self) -> int:
        return int(self.row_indptr[-1])


def split_rows(host: HostCsr, width: int) -> tuple[np.ndarray, np.ndarray]:
    """[S, GEOMETRY_FIELDS] tile geometry and [R+1] row pointers. A row of P
    pages gets ceil(P / width) tiles of near-equal length (no short tail tile)."""
    if width < 1:
        raise ValueError(f"tile width must be >= 1 page, got {width}")
    pages = host.num_pages().astype(np.int64)
    tiles_per_row = -(-pages // width)
    row_indptr = np.zeros(len(pages) + 1, np.int64)
    np.cumsum(tiles_per_row, out=row_indptr[1:])
    tile_row = np.repeat(np.arange(len(pages)), tiles_per_row)
    index = np.arange(len(tile_row)) - row_indptr[tile_row]
    count = tiles_per_row[tile_row]
    start = index * pages[tile_row] // count
    stop = (index + 1) * pages[tile_row] // count
    geometry = np.stack([
        tile_row,
        host.indptr[tile_row].astype(np.int64) + start,
        stop - start,
        np.where(index == 0, host.first_page_offset[tile_row], 0),
        (index == count - 1).astype(np.int64),
    ], axis=1) if len(tile_row) else np.zeros((0, GEOMETRY_FIELDS), np.int64)
    return geometry.astype(np.int32), row_indptr


def plan_tiles(host: HostCsr, width: int) -> TilePlan:
    geometry, row_indptr = split_rows(host, width)
    device_geometry, device_indptr = upload(geometry.reshape(-1, GEOMETRY_FIELDS), row_indptr)
    return TilePlan(
        geometry=device_geometry,
        row_indptr=row_indptr,
        row_indptr_device=device_indptr,
        one_per_row=bool((np.diff(row_indptr) == 1).all()),
    )


def tile_width(num_pages: np.ndarray, blocks_per_tile: int, block_size: int,
               target_blocks: int = TARGET_BLOCKS, min_tokens: int = MIN_TILE_TOKENS) -> int:
    """Pages per tile: the widest that still yields ``target_blocks`` blocks
    (``blocks_per_tile`` = KV heads x head groups), but never under
    ``min_tokens`` unless the longest row is shorter. Long batches keep one
    tile per row (no merge); a single long row (cascade level 0) is split."""
    pages = num_pages[num_pages > 0].astype(np.int64)
    if len(pages) == 0:
        return 1
    longest = int(pages.max())
    narrowest = min(longest, max(1, -(-min_tokens // block_size)))
    wanted = -(-target_blocks // max(blocks_per_tile, 1))

    def tiles(width: int) -> int:
        return int((-(-pages // width)).sum())

    if tiles(longest) >= wanted:
        return longest
    low, high = narrowest, longest          # tiles() is non-increasing in width
    if tiles(low) < wanted:
        return low
    while low < high:                       # widest width with tiles(width) >= wanted
        mid = (low + high + 1) // 2
        if tiles(mid) >= wanted:
            low = mid
        else:
            high = mid - 1
    return low


def wave_width(num_pages: np.ndarray, blocks_per_tile: int, block_size: int, resident: int,
               min_tokens: int = MIN_TILE_TOKENS) -> int:
    """Pages per tile for a launch of ``resident`` blocks an SM: one tile a
    row where that alone offers TARGET_BLOCKS blocks (no merge); else, of the
    widths that cut the longest row into 1, 2, ... even tiles (none under
    ``min_tokens`` unless the longest row is shorter) and take at most two
    waves of blocks, the widest whose blocks fill at least WAVE_FILL of their
    waves (blocks / (waves x resident blocks)), or the best filled if none
    does. A last wave of a few blocks costs a block's whole time, and each
    more tile a row costs a merge input and a tile's prologue: measured on an
    H100 (the transposed int8 kernel at 8192 x 32, 660 slots),
    TARGET_BLOCKS' 768 blocks (1.16 waves) took 0.177 ms, 512 (0.78) 0.137,
    1280 (0.97 of two) 0.140; at 32768 x 32, 0.649, 0.469 and 0.481."""
    pages = num_pages[num_pages > 0].astype(np.int64)
    if len(pages) == 0:
        return 1
    longest = int(pages.max())
    if len(pages) * blocks_per_tile >= TARGET_BLOCKS:
        return longest
    narrowest = min(longest, max(1, -(-min_tokens // block_size)))
    slots = resident * MULTIPROCESSORS
    # Every cut at once (a replan on the decode path, up to longest / narrowest cuts).
    cuts = np.arange(1, longest // narrowest + 1)
    widths = -(-longest // cuts)
    blocks = (-(-pages[None, :] // widths[:, None])).sum(axis=1) * blocks_per_tile
    fill = np.where((cuts == 1) | (blocks <= 2 * slots), blocks / (-(-blocks // slots) * slots), 0.0)
    filled = np.flatnonzero(fill >= WAVE_FILL)
    return int(widths[filled[0] if len(filled) else np.argmax(fill)])     # argmax: the first best, the widest


def fused_tiles(csr: PagedCsrView, chunk_pages: int | None, layout: HeadLayout, kv_heads: int,
                target_blocks: int = TARGET_BLOCKS, resident: int | None = None) -> TilePlan:
    """The view's tiles for a fused launch with this head layout: the widest
    offering ``target_blocks`` blocks (tile_width; measured on the m16
    kernels, three blocks an SM), or, given the launch's ``resident`` blocks
    an SM (the transposed kernels), the width whose blocks fill their waves
    (wave_width). ``chunk_pages`` (argument or MLXCEL_CHUNK_PAGES, as for the
    portable kernels) overrides both."""
    blocks_per_tile = kv_heads * layout.groups
    min_tokens = max(MIN_TILE_TOKENS, TOKENS_PER_HEAD * layout.heads)
    pages = csr.host.num_pages()
    width = requested_width(chunk_pages) or (
        wave_width(pages, blocks_per_tile, csr.block_size, resident, min_tokens) if resident
        else tile_width(pages, blocks_per_tile, csr.block_size, target_blocks=target_blocks, min_tokens=min_tokens))
    return plan_tiles(csr.host, width)
