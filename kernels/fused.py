"""Host side of the fused paged-attention kernels, shared by CUDA and Metal.

A platform module (``cuda``, ``metal``) supplies only its kernel sources and
its kernel factory; this module plans the tiles, picks template constants,
sizes the grid and launches, identically for both:

- the partial kernel: one block per (page tile, head group, KV head) reads its
  pages in place, stages each chunk of K and V tokens in shared memory once
  and runs every query head of the KV head against it on the matrix units
  (16-bit operands, float32 accumulation), writing a normalized state and a
  log2 LSE per (tile, head);
- the merge kernel: one warp per (group, head) folds contiguous states by
  log-sum-exp; it merges a row's tiles and serves ``merge_states``;
- the cascade merge kernel: a whole cascade decode step's fold (the row's
  private states and, at each depth, every tile of the row's span at the
  member's stacked head) straight into the output dtype. With the partial
  kernel reading each level's queries through its member table (no stacked
  copy; a row per span, so one launch serves every span of a depth), a
  cascade step of depth D is D + 2 launches where the generic path (stack,
  partials, tile merges, unstack, concatenate, reorder, merge, cast) is about
  fifteen for one level: on MLX's CUDA backend each costs several
  microseconds, more than a shared span's bytes.

Quantized pools (``kv_quant``: int8, int4) are read as codes: the partial
kernel stages codes and scales as the pool holds them and dequantizes them
to float16 matrix operands in registers (one more variant of the same
source; a float pool's launch is unchanged).

Pools the kernels do not take (float32, a float head dim that is not a
multiple of 32 up to 128, a quantized one other than 64 or 128) go through
the portable kernels, on the same device.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import struct
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable

import mlx.core as mx
import numpy as np

from . import portable
from .csr import PagedCsrView, upload
from .kv_quant import SCALE_DTYPE, KVQuant, Pages, QuantizedPages
from .shape import AttentionShape, check_inputs
from .tile_plan import (HEADS_PER_WARP, LEVEL0_TARGET_BLOCKS, HeadLayout, TilePlan, fused_tiles, head_layout,
                        level0_max_warps_m, transposed, transposed_resident_blocks)

log = logging.getLogger(__name__)
_warned: set[str] = set()      # env values already warned about (once a process)

LOG2E = 1.0 / math.log(2.0)

# Tensor-core operands are 16-bit; a float32 pool would need a different
# (tf32) fragment layout for a configuration nobody serves from.
KERNEL_DTYPES = (mx.bfloat16, mx.float16)
MAX_HEAD_DIM = 128        # accumulators (D/2 floats) + Q fragments (D/4 words) per lane stay in registers
# Quantized pages: an int8 key row is read 64 codes per ldmatrix, an int4 one
# 64 or 128; 64 and 128 are the head dims models quantize.
QUANTIZED_HEAD_DIMS = (64, 128)
# A staged code row's padding: rows an odd number of 16-byte units apart, so
# ldmatrix's eight row addresses hit distinct banks.
CODE_ROW_PAD = 16
MERGE_THREADS = 128
# Floats a warp's state row holds in shared memory besides its D accumulators:
# the row's max, its sum, and its weight in the merge of the token-splitting warps.
STATE_EXTRA_FLOATS = 3
POISON_ENV = "MLXCEL_POISON_OUTPUTS"
# Which kernel runs a cascade's stacked levels: "mma" (the partial kernel) or
# "warpgroup" (the platform's warpgroup-MMA kernel); unset: warpgroup where the
# platform and device have it.
LEVEL0_KERNEL_ENV = "MLXCEL_LEVEL0_KERNEL"
WARPGROUP_ROWS = 64       # stacked heads a warpgroup of the warpgroup kernel owns
# A block of it, by the pages' format (None: 16-bit): (warpgroups it may
# hold, which share its staged chunks; its ring's chunks, None: the
# platform's). Two warpgroups read each chunk once for 128 heads where blocks
# of one read it twice (from L2), but measured on the H200 in the engine's
# 8192 x 32 step (one process, A B B A), 16-bit level 0 took 0.69 / 0.74 ms a
# step with two, 0.62 / 0.64 with one (one 8-warp block an SM by registers
# against two of 4 warps, which overlap one's softmax with the other's
# products; in turn-taking blocks of two, no faster, H100). int8 blocks also
# convert each staged chunk into operands, once a block: two warpgroups and a
# ring of three were 4-7% faster than one warpgroup and two, 11% faster again
# at 32768 with the next chunk converted under this one's O += P V, 9%
# faster again with a producer warpgroup converting for both, and 9% again
# at 32768 with two (the kernel, H100: 8192 and 32768 shared x 32; a ring of
# four no faster).
WARPGROUP_BLOCKS = {None: (1, None), "int8": (2, 3)}


def has_producer(warps: int, quant: KVQuant | None) -> bool:
    """Whether a warpgroup block of ``warps`` gets producer warpgroups that
    stage and convert its chunks into two operand pairs (cuda_warpgroup's
    PRODUCER): quantized pages' blocks of two or more warpgroups."""
    return quant is not None and warps >= 8


def block_threads(layout: HeadLayout, quant: KVQuant | None) -> int:
    """A partial launch's block: its layout's warps, and the two producer
    warpgroups' where a warpgroup layout has them (cuda_warpgroup's
    PRODUCER_THREADS)."""
    producer = layout.warpgroup and has_producer(layout.warps, quant)
    return 32 * layout.warps + (256 if producer else 0)


PARTIAL_INPUTS = ["q", "k_pool", "v_pool", "indices", "last_page_len", "tiles", "members"]
# Quantized pools: k_pool / v_pool are the codes, their scales and zeros follow (int8: zeros a placeholder).
QUANTIZED_PARTIAL_INPUTS = ["q", "k_pool", "v_pool", "k_scales", "v_scales", "k_zeros", "v_zeros", "indices",
                            "last_page_len", "tiles", "members"]
MERGE_INPUTS = ["v_in", "lse_in", "indptr"]
# The cascade merge takes the private states and up to MAX_DEPTH levels' (unused ones: a placeholder).
MAX_DEPTH = 4
LEVEL_STATE_INPUTS = [*(f"{name}{d}" for d in range(MAX_DEPTH) for name in ("o", "lse")), "level_map"]
CASCADE_MERGE_INPUTS = ["op", "lsep", "indptrp", *LEVEL_STATE_INPUTS]
STATE_OUTPUTS = ["out", "out_lse"]

# (name, input names, output names, source, header, dynamic shared bytes) -> kernel
KernelFactory = Callable[[str, list, list, str, str, int], Callable]


@dataclass(frozen=True)
class Launch:
    """A kernel with everything but its inputs decided (template constants,
    grid, output shapes): what a step's layout and shapes fix, so a decode
    step that keeps its layout passes only arrays (the host's Python work per
    launch is decode time on a host-bound step)."""

    kernel: Callable
    options: dict

    def __call__(self, inputs: list, init_value: float | None) -> list[mx.array]:
        return self.kernel(inputs=inputs, init_value=init_value, **self.options)


@dataclass(frozen=True)
class FusedPartial:
    """The partial kernel (and its tile merge) over one page layout, planned:
    called with each step's (q, k_pool, v_pool, last_page_len)."""

    kernels: "FusedKernels"
    launch: Launch
    plan: TilePlan
    indices: mx.array
    rows: int

    def __call__(self, q: mx.array, k_pool: Pages, v_pool: Pages,
                 last_page_len: mx.array) -> tuple[mx.array, mx.array]:
        if self.plan.num_tiles == 0:
            return portable.no_states(self.rows, q)
        o, lse = self.kernels.run_partial(self.launch, q, k_pool, v_pool, self.indices, last_page_len,
                                          self.plan.geometry)
        if self.plan.one_per_row:
            return o, lse
        return self.kernels.merge_groups(o, lse, self.plan.row_indptr_device)


@dataclass(frozen=True)
class FusedLevel:
    """One depth of a cascade: a stacked partial launch, a row per span."""

    launch: Launch
    view: PagedCsrView          # one row per span, every page full
    geometry: mx.array
    members: mx.array           # [spans, M] member rows (a narrower span's padding repeats its first)


# Arrays a FusedCascade reads besides q and the pool: the private level's, then each depth's.
PRIVATE_ARRAYS = 4
LEVEL_ARRAYS = 4


@dataclass(frozen=True)
class FusedCascade:
    """A cascade decode step's launches over one layout, planned (one per
    depth, the private level, the merge; or the private level merging, where
    the platform's kernel does and a row's private pages are one tile): called
    with each step's (q, k_pool, v_pool, last_page_len), returns o in q's dtype.

    A trace of it (``mx.compile``, a whole decoder layer in the engine) takes
    its ``arrays()`` as inputs and calls ``rebind(arrays)``: the trace then
    depends only on ``signature`` (the launches' kernels and options) and the
    arrays' shapes, so the next layout of the same signature replays it."""

    kernels: "FusedKernels"
    levels: tuple[FusedLevel, ...]
    private: Launch
    merge: Launch | None        # None: the private launch merges
    private_indices: mx.array
    geometry_private: mx.array
    indptr_private: mx.array
    level_map: mx.array

    def __call__(self, q: mx.array, k_pool: Pages, v_pool: Pages, last_page_len: mx.array) -> mx.array:
        k = self.kernels
        states = []
        for level in self.levels:
            states += k.run_partial(level.launch, q, k_pool, v_pool, level.view.indices, level.view.last_page_len,
                                    level.geometry, level.members)
        states += [k.no_level] * (2 * (MAX_DEPTH - len(self.levels)))
        if self.merge is None:
            return k.run_partial(self.private, q, k_pool, v_pool, self.private_indices, last_page_len,
                                 self.geometry_private, levels=[*states, self.level_map])[0]
        op, lsep = k.run_partial(self.private, q, k_pool, v_pool, self.private_indices, last_page_len,
                                 self.geometry_private)
        return self.merge([op, lsep, self.indptr_private, *states, self.level_map], k.poison)[0]

    def arrays(self) -> tuple[mx.array, ...]:
        """The layout's arrays, in ``rebind``'s order."""
        levels = (a for lv in self.levels for a in (lv.view.indices, lv.view.last_page_len, lv.geometry, lv.members))
        return (self.private_indices, self.geometry_private, self.indptr_private, self.level_map, *levels)

    def rebind(self, arrays) -> "FusedCascade":
        """The same launches over ``arrays`` (``arrays()``'s order and shapes)."""
        private_indices, geometry_private, indptr_private, level_map = arrays[:PRIVATE_ARRAYS]
        levels = []
        for i, level in enumerate(self.levels):
            at = PRIVATE_ARRAYS + LEVEL_ARRAYS * i
            indices, last_page_len, geometry, members = arrays[at:at + LEVEL_ARRAYS]
            levels.append(FusedLevel(level.launch, replace(level.view, indices=indices, last_page_len=last_page_len),
                                     geometry, members))
        return replace(self, levels=tuple(levels), private_indices=private_indices,
                       geometry_private=geometry_private, indptr_private=indptr_private, level_map=level_map)

    @cached_property
    def signature(self) -> tuple:
        """What a trace bakes in besides the arrays' shapes: each launch's kernel and options, the poison."""
        launches = (*(level.launch for level in self.levels), self.private, *([self.merge] if self.merge else []))
        return (tuple((id(launch.kernel), repr(launch.options)) for launch in launches), repr(self.kernels.poison))


@dataclass(frozen=True)
class Platform:
    name: str
    header: str
    partial_source: str
    merge_source: str
    cascade_merge_source: str
    make_kernel: KernelFactory
    warps: int            # warps (simdgroups) of 32 lanes per partial block
    chunk_tokens: int     # KV tokens staged per iteration
    stages: int           # staging buffers (2: the next chunk loads while this one is used)

    quantized_partial_source: str = ""   # the partial kernel's source for quantized pools
    # A cascade's private level merging the levels' states (float, quantized pools); "": a merge launch.
    merged_partial_source: str = ""
    merged_quantized_partial_source: str = ""
    # The stacked levels' kernel on warpgroup MMA (16-bit pages; int8 pages), and whether this device runs it.
    warpgroup_partial_source: str = ""
    warpgroup_quantized_partial_source: str = ""
    warpgroup_device: Callable[[], bool] = lambda: False
    # Quantized pages under few heads a block run the products transposed (tile_plan.transposed; CUDA's).
    transposes: bool = False

    def warpgroup_staging_bytes(self, head_dim: int, warps: int, stages: int | None = None,
                                quant: KVQuant | None = None) -> int:
        """Shared memory of a warpgroup block: its warpgroups' 64 rows of Q
        each and the ring's K and V chunks, unpadded (the layouts' swizzle
        spreads the banks), and the slack that starts them on a 1024-byte
        boundary (the swizzle's period). int8 pages: the ring holds the
        partial kernel's stages, beside one chunk's K and V converted (two
        chunks' where a producer converts)."""
        rows = warps // 4 * WARPGROUP_ROWS
        chunk, stages = self.chunk_tokens, stages or self.stages
        if quant is None:
            return (rows + 2 * stages * chunk) * head_dim * 2 + 1024
        code_stage = 2 * chunk * (quant.code_width(head_dim) + CODE_ROW_PAD + staged_scale_bytes(quant, head_dim))
        pairs = 2 if has_producer(warps, quant) else 1
        return (rows + 2 * pairs * chunk) * head_dim * 2 + stages * code_stage + 1024

    def staging_bytes(self, head_dim: int, warps: int, quant: KVQuant | None = None,
                      stages: int | None = None) -> int:
        """Shared memory of one partial block of ``warps`` warps: the K and V
        chunks of every stage (rows padded by 8 elements so matrix loads hit
        distinct banks; quantized pages: code rows padded by CODE_ROW_PAD
        bytes, and each token's staged scales), reused after the loop for the
        warps' states (float32 accumulators, max, sum, merge weight)."""
        if quant is None:
            token = 2 * (head_dim + 8) * 2
        else:
            arrays = 4 if quant.affine else 2          # K, V scales (and zeros)
            token = 2 * (quant.code_width(head_dim) + CODE_ROW_PAD) + arrays * staged_scale_bytes(quant, head_dim)
        staged = (stages or self.stages) * self.chunk_tokens * token
        states = warps * HEADS_PER_WARP * (head_dim + STATE_EXTRA_FLOATS) * 4
        return max(staged, states)


def staged_scale_bytes(quant: KVQuant, head_dim: int) -> int:
    """Bytes one token's scales (or zeros) take in a stage: int4's groups;
    int8's one scale travels as the aligned 4-byte pair holding it (cp.async
    copies no less)."""
    return quant.groups(head_dim) * SCALE_DTYPE.size if quant.affine else 4


def scale_bits(scale: float) -> int:
    """The float32 bits of scale * log2(e), as a template int: the kernel
    works in the log2 domain (exp2) and a model has one scale, so baking it in
    costs one compile per model, not an argument upload per call."""
    return struct.unpack("<i", struct.pack("<f", float(scale) * LOG2E))[0]


def unsupported(shape: AttentionShape) -> str | None:
    """Why the fused kernel does not take launches of this shape, or None."""
    d, quant = shape.head_dim, shape.kv_quant
    if quant is not None:
        if d not in QUANTIZED_HEAD_DIMS:
            dims = " or ".join(map(str, QUANTIZED_HEAD_DIMS))
            return f"head dim {d} of {quant.name} pages (fused kernels read {dims})"
        if shape.block_size % 2:
            # A staged int8 scale's half is its row's parity, found from the token's (pages of an even size).
            return f"block size {shape.block_size} of {quant.name} pages (fused kernels read even page sizes)"
        return None
    if shape.pool_dtype not in KERNEL_DTYPES:
        return f"pool dtype {shape.pool_dtype} (fused kernels take bfloat16/float16)"
    if d % 32 or d > MAX_HEAD_DIM:
        return f"head dim {d} (fused kernels take multiples of 32 up to {MAX_HEAD_DIM})"
    return None


def compact_source(text: str) -> str:
    """Kernel text without comments, indentation or blank lines. MLX rebuilds
    and hashes a custom kernel's whole source on every call (build_kernel,
    then std::hash in CustomKernel::eval_gpu), so its length is host time on
    every launch (CUDA hands MLX only an #include of it: cuda.make_kernel);
    line structure is kept for the compiler's messages."""
    lines = (line.split("//", 1)[0].strip() for line in text.splitlines())
    return "\n".join(line for line in lines if line) + "\n"


def poison_from_env() -> float | None:
    text = os.environ.get(POISON_ENV, "").strip()
    return float(text) if text else None


@dataclass
class FusedKernels:
    """The two fused kernels of one platform, compiled on first use per head dim."""

    platform: Platform
    # A value (NaN) every output is filled with before the kernel runs, so
    # tests prove each element is written. Off in serving: the fill is an
    # extra launch per output. MLXCEL_POISON_OUTPUTS=nan sets it for a whole run.
    poison: float | None = field(default_factory=poison_from_env)
    _kernels: dict = field(default_factory=dict)

    def _kernel(self, kind: str, head_dim: int, warps: int = 0, quant: KVQuant | None = None,
                stages: int = 0) -> Callable:
        key = (kind, head_dim, warps, quant, stages)
        kernel = self._kernels.get(key)
        if kernel is None:
            p = self.platform
            source, inputs, outputs = {
                "partial": (p.partial_source, PARTIAL_INPUTS, STATE_OUTPUTS),
                "quantized_partial": (p.quantized_partial_source, QUANTIZED_PARTIAL_INPUTS, STATE_OUTPUTS),
                "warpgroup_partial": (p.warpgroup_partial_source, PARTIAL_INPUTS, STATE_OUTPUTS),
                "warpgroup_quantized_partial": (p.warpgroup_quantized_partial_source, QUANTIZED_PARTIAL_INPUTS,
                                                STATE_OUTPUTS),
                "merged_partial": (p.merged_partial_source, PARTIAL_INPUTS + LEVEL_STATE_INPUTS, ["out"]),
                "merged_quantized_partial": (p.merged_quantized_partial_source,
                                             QUANTIZED_PARTIAL_INPUTS + LEVEL_STATE_INPUTS, ["out"]),
                "merge": (p.merge_source, MERGE_INPUTS, STATE_OUTPUTS),
                "cascade_merge": (p.cascade_merge_source, CASCADE_MERGE_INPUTS, ["out"]),
            }[kind]
            # The digest names the source: MLX caches compiled kernels by name
            # (on disk too), so an edited source must never reuse an old binary.
            digest = hashlib.sha1((p.header + source).encode()).hexdigest()[:12]
            shared = (p.warpgroup_staging_bytes(head_dim, warps, stages, quant) if kind.startswith("warpgroup")
                      else p.staging_bytes(head_dim, warps, quant, stages) if kind.endswith("partial") else 0)
            kernel = p.make_kernel(f"mlxcel_{kind}_{digest}", inputs, outputs, compact_source(source),
                                   compact_source(p.header), shared)
            self._kernels[key] = kernel
        return kernel

    def transposed(self, layout: HeadLayout, quant: KVQuant | None, stacked: bool) -> bool:
        """Whether this platform runs a partial launch's products transposed."""
        return self.platform.transposes and transposed(layout.heads, quant, stacked)

    def flat_resident(self, layout: HeadLayout, quant: KVQuant | None, head_dim: int) -> int | None:
        """Blocks an SM of an unstacked launch whose tiles are cut by the
        waves they fill (the transposed kernels); None: by TARGET_BLOCKS."""
        return transposed_resident_blocks(quant, head_dim) if self.transposed(layout, quant, False) else None

    def partial_launch(self, shape: AttentionShape, tiles: int, layout: HeadLayout, stacked: bool,
                       stages: int | None = None, merge: tuple[int, bool] | None = None) -> Launch:
        """The partial kernel over ``tiles`` tiles: states o [S, Hkv * heads, D]
        float32, lse [S, Hkv * heads] log2. ``stacked`` (cascade level 0): the
        kernel stacks the member rows' heads itself, kv-head-major, reading q
        [R, Hq, D] in place. ``stages``: the staging ring's chunks (default:
        the platform's; sweeps). A warpgroup layout launches the platform's
        warpgroup-MMA kernel (cascade_levels says where). ``merge`` (levels,
        member_is_row): a cascade's private level, a tile a row, writing the
        step's output [R, Hq, D] in q's dtype, the levels' states folded in."""
        d, hkv, quant = shape.head_dim, shape.kv_heads, shape.kv_quant
        p = self.platform
        stages = stages or p.stages
        kind = "quantized_partial" if quant else "partial"
        if layout.warpgroup:
            kind = f"warpgroup_{kind}"
        template = [("T", shape.pool_dtype), ("TQ", shape.q_dtype), ("D", d), ("BLOCK", shape.block_size),
                    ("WM", layout.warps_m), ("STACKED", stacked),
                    ("HEADS_ON_N", self.transposed(layout, quant, stacked)), ("WARPS", layout.warps),
                    ("CHUNK", p.chunk_tokens), ("STAGES", stages), ("SCALE_BITS", scale_bits(shape.scale))]
        # The page size is a template constant: page lookups become shifts.
        outputs = dict(output_shapes=[(tiles, hkv * layout.heads, d), (tiles, hkv * layout.heads)],
                       output_dtypes=[mx.float32, mx.float32])
        if merge is not None:
            kind = f"merged_{kind}"
            template += [("DEPTHS", merge[0]), ("MEMBER_IS_ROW", merge[1]), ("TO", shape.q_dtype)]
            outputs = dict(output_shapes=[(tiles, shape.q_heads, d)], output_dtypes=[shape.q_dtype])
        threads = block_threads(layout, quant)
        return Launch(self._kernel(kind, d, layout.warps, quant, stages), dict(
            template=template,
            grid=(tiles * layout.groups * threads, hkv, 1),
            threadgroup=(threads, 1, 1),
            **outputs,
        ))

    def partial_tiles(self, q: mx.array, k_pool: Pages, v_pool: Pages, csr: PagedCsrView,
                      geometry: mx.array, layout: HeadLayout, scale: float,
                      members: mx.array | None = None) -> tuple[mx.array, mx.array]:
        """One launch: the states of every tile (see partial_launch); with
        ``members``, cascade level 0."""
        launch = self.partial_launch(AttentionShape.of(q, k_pool, scale), geometry.shape[0], layout,
                                     members is not None)
        return self.run_partial(launch, q, k_pool, v_pool, csr.indices, csr.last_page_len, geometry, members)

    def run_partial(self, launch: Launch, q: mx.array, k_pool: Pages, v_pool: Pages, indices: mx.array,
                    last_page_len: mx.array, geometry: mx.array, members: mx.array | None = None,
                    levels: list | None = None) -> list[mx.array]:
        """A partial launch's inputs, in PARTIAL_INPUTS order (quantized
        pools: QUANTIZED_PARTIAL_INPUTS, the codes, then scales and zeros);
        a merging one's LEVEL_STATE_INPUTS (``levels``) after them."""
        if isinstance(k_pool, QuantizedPages):
            pools = [k_pool.codes, v_pool.codes, k_pool.scales, v_pool.scales,
                     self._no_zeros if k_pool.zeros is None else k_pool.zeros,
                     self._no_zeros if v_pool.zeros is None else v_pool.zeros]
        else:
            pools = [k_pool, v_pool]
        return launch([q, *pools, indices, last_page_len, geometry,
                       self._no_members if members is None else members, *(levels or [])], self.poison)

    @cached_property
    def _no_zeros(self) -> mx.array:
        """The zeros input of an int8 pool's launch (read by no thread)."""
        return mx.zeros((1,), SCALE_DTYPE)

    @cached_property
    def _no_members(self) -> mx.array:
        """The members input of an unstacked launch (read by no thread)."""
        return mx.zeros((1, 1), mx.int32)

    @cached_property
    def no_level(self) -> mx.array:
        """The cascade merge's input for a depth the plan does not have (read by no thread)."""
        return mx.zeros((1, 1), mx.float32)

    def merge_groups(self, v_in: mx.array, lse_in: mx.array, indptr: mx.array) -> tuple[mx.array, mx.array]:
        """One launch: v [M, H, D], lse [M, H] from contiguous groups of states."""
        groups, (_, heads, d) = indptr.shape[0] - 1, v_in.shape
        lanes = groups * heads * 32
        return self._kernel("merge", d)(
            inputs=[v_in, lse_in, indptr],
            template=[("TV", v_in.dtype), ("TL", lse_in.dtype), ("D", d)],
            grid=(-(-lanes // MERGE_THREADS) * MERGE_THREADS, 1, 1),
            threadgroup=(MERGE_THREADS, 1, 1),
            output_shapes=[(groups, heads, d), (groups, heads)],
            output_dtypes=[mx.float32, mx.float32],
            init_value=self.poison,
        )

    def prepare_partial(self, csr: PagedCsrView, shape: AttentionShape,
                        chunk_pages: int | None = None) -> "FusedPartial | portable.PartialLaunch":
        """paged_attention_partial over this layout, planned once (tiles,
        template constants, grid); shapes the kernel does not take get the
        portable kernels."""
        if unsupported(shape):
            return portable.prepare_partial(csr, shape, chunk_pages)
        layout = head_layout(shape.group, self.platform.warps)
        resident = self.flat_resident(layout, shape.kv_quant, shape.head_dim)
        plan = fused_tiles(csr, chunk_pages, layout, shape.kv_heads, resident=resident)
        return FusedPartial(self, self.partial_launch(shape, plan.num_tiles, layout, stacked=False), plan,
                            csr.indices, csr.num_rows)

    def paged_attention_partial(self, q: mx.array, k_pool: Pages, v_pool: Pages, csr: PagedCsrView,
                                *, scale: float, chunk_pages: int | None = None) -> tuple[mx.array, mx.array]:
        check_inputs(q, k_pool, csr)
        launch = self.prepare_partial(csr, AttentionShape.of(q, k_pool, scale), chunk_pages)
        return launch(q, k_pool, v_pool, csr.last_page_len)

    def prepare_merge(self, o_indptr, head_dim: int) -> Callable[[mx.array, mx.array], tuple[mx.array, mx.array]]:
        """merge_states over these groups, their layout uploaded once."""
        indptr = np.asarray(o_indptr, dtype=np.int64)
        if head_dim % 32 or (np.diff(indptr) == 1).all() or len(indptr) < 2:
            return portable.prepare_merge(indptr, head_dim)
        device = mx.array(indptr.astype(np.int32))
        return lambda v, lse: self.merge_groups(v, lse, device)

    def merge_states(self, v_in: mx.array, lse_in: mx.array, o_indptr) -> tuple[mx.array, mx.array]:
        if v_in.shape[0] == 0:
            return portable.merge_states(v_in, lse_in, o_indptr)
        if isinstance(o_indptr, mx.array) and v_in.shape[-1] % 32 == 0:
            return self.merge_groups(v_in, lse_in, o_indptr.astype(mx.int32))
        return self.prepare_merge(np.asarray(o_indptr), v_in.shape[-1])(v_in, lse_in)

    def takes(self, shape: AttentionShape) -> bool:
        return unsupported(shape) is None

    def takes_warpgroup(self, shape: AttentionShape, level0_warps_m: int | None = None,
                        level0_warps: int | None = None) -> bool:
        """Whether a cascade's stacked levels run on the warpgroup kernel:
        16-bit or int8 pages (where the platform has that kernel) of a head dim
        of 64 or 128 on a device that has it, the platform's blocks and
        chunks, no sweep of the partial kernel's layout, and
        ``LEVEL0_KERNEL_ENV`` not asking for the partial kernel. int4 pages
        keep the partial kernel."""
        p = self.platform
        choice = os.environ.get(LEVEL0_KERNEL_ENV, "").strip().lower()
        if choice not in ("", "mma", "warpgroup") and choice not in _warned:
            _warned.add(choice)
            log.warning("%s=%r: expected mma or warpgroup, using the default", LEVEL0_KERNEL_ENV, choice)
        quant = shape.kv_quant
        source = (p.warpgroup_partial_source if quant is None
                  else "" if quant.affine else p.warpgroup_quantized_partial_source)
        return (choice != "mma" and bool(source)
                and shape.head_dim in (64, 128) and p.chunk_tokens == 64 and p.warps == 4
                and level0_warps_m is None and level0_warps in (None, p.warps) and p.warpgroup_device())

    def cascade_levels(self, q_heads: int, kv_heads: int, private: PagedCsrView, levels,
                       level0_pages: int | None = None, level0_warps_m: int | None = None,
                       level0_warps: int | None = None, quant: KVQuant | None = None,
                       warpgroup: bool = False, head_dim: int = 128) -> tuple[tuple[tuple[HeadLayout, TilePlan], ...],
                                                                              tuple[HeadLayout, TilePlan]]:
        """(head layout, tiles) of each depth (every member's heads stacked,
        ``levels`` as prepare_cascade takes them) and of the private level.
        ``level0_pages`` fixes the stacked levels' tile width,
        ``level0_warps_m`` caps their head-splitting warps (default: the
        pages' format's cap, ``quant``) and ``level0_warps`` sets their
        blocks' warps (benchmark sweeps). ``warpgroup``: the stacked levels
        of more than two warps' heads run on the warpgroup kernel (a
        warpgroup: 64 heads, a warp's 16 each; fewer heads would leave most
        rows empty), up to the format's WARPGROUP_BLOCKS a block.
        ``head_dim``: quantized pages' private level is cut by the waves of
        its kernel's resident blocks at that head dim."""
        group = q_heads // kv_heads
        stacked = []
        for view, members in levels:
            heads = np.shape(members)[1] * group
            warps = level0_warps or self.platform.warps
            if warpgroup and heads > 2 * HEADS_PER_WARP:
                warps = 4 * min(WARPGROUP_BLOCKS[quant and quant.name][0], -(-heads // WARPGROUP_ROWS))
                layout = replace(head_layout(heads, warps, warps), warpgroup=True)
            else:
                layout = head_layout(heads, warps, level0_warps_m or level0_max_warps_m(quant))
            # Counted in blocks of the platform's warps: bigger blocks get proportionally fewer.
            target = LEVEL0_TARGET_BLOCKS * self.platform.warps // warps
            stacked.append((layout, fused_tiles(view, level0_pages, layout, kv_heads, target)))
        flat = head_layout(group, self.platform.warps)
        plan_private = fused_tiles(private, None, flat, kv_heads, resident=self.flat_resident(flat, quant, head_dim))
        return tuple(stacked), (flat, plan_private)

    def prepare_cascade(self, shape: AttentionShape, rows: int, private: PagedCsrView, levels,
                        level0_pages: int | None = None, level0_warps_m: int | None = None,
                        level0_warps: int | None = None, level0_stages: int | None = None,
                        reuse: FusedCascade | None = None) -> FusedCascade:
        """One cascade decode step's launches, planned once per layout.

        ``private``: every row's range after its last span; ``levels``: per
        depth, (a view with one row per span, all pages full; [spans, M]
        int32 member rows, -1 past a span's own members). The sweep options
        are cascade_levels' and ``level0_stages`` (partial_launch). ``reuse``: a cascade of the same levels and rows,
        whose level launches and map are kept."""
        if not 1 <= len(levels) <= MAX_DEPTH:
            raise ValueError(f"the fused cascade takes 1 to {MAX_DEPTH} levels, got {len(levels)}")
        hq, hkv, d, quant = shape.q_heads, shape.kv_heads, shape.head_dim, shape.kv_quant
        warpgroup = self.takes_warpgroup(shape, level0_warps_m, level0_warps)
        stacked, (flat, plan_private) = self.cascade_levels(hq, hkv, private, levels if reuse is None else (),
                                                            level0_pages, level0_warps_m, level0_warps, quant,
                                                            warpgroup, d)
        level_map = np.zeros((rows, len(levels), 3), np.int32)
        fused_levels = []
        for depth, ((view, members), (layout, plan)) in enumerate(zip(levels, stacked)):
            members = np.asarray(members, np.int32)
            for (span, slot), row in np.ndenumerate(members):
                if row >= 0:
                    first = plan.row_indptr[span]
                    level_map[row, depth] = (first, plan.row_indptr[span + 1] - first, slot)
            table = np.where(members >= 0, members, members[:, :1])
            stages = level0_stages or (WARPGROUP_BLOCKS[quant and quant.name][1] if layout.warpgroup else None)
            launch = self.partial_launch(shape, plan.num_tiles, layout, stacked=True, stages=stages)
            fused_levels.append(FusedLevel(launch, view, plan.geometry, upload(table)[0]))
        first_level = np.asarray(levels[0][1])
        member_is_row = bool(len(levels) == 1 and first_level.shape == (1, rows)
                             and (first_level[0] == np.arange(rows)).all())
        # The private level merges where its kernel does: a tile a row, one head group.
        merging = bool(self.platform.merged_partial_source) and plan_private.one_per_row and flat.groups == 1
        merge = None
        if not merging:
            lanes = rows * hq * 32
            merge = Launch(self._kernel("cascade_merge", d), dict(
                template=[("TO", shape.q_dtype), ("D", d), ("G", hq // hkv), ("DEPTHS", len(levels)),
                          ("MEMBER_IS_ROW", member_is_row), ("PRIVATE_ONE", plan_private.one_per_row)],
                grid=(-(-lanes // MERGE_THREADS) * MERGE_THREADS, 1, 1),
                threadgroup=(MERGE_THREADS, 1, 1),
                output_shapes=[(rows, hq, d)],
                output_dtypes=[shape.q_dtype],
            ))
        private_launch = self.partial_launch(shape, plan_private.num_tiles, flat, stacked=False,
                                             merge=(len(levels), member_is_row) if merging else None)
        return FusedCascade(
            kernels=self, levels=tuple(fused_levels) if reuse is None else reuse.levels,
            private=private_launch, merge=merge, private_indices=private.indices,
            geometry_private=plan_private.geometry, indptr_private=plan_private.row_indptr_device,
            level_map=upload(level_map)[0] if reuse is None else reuse.level_map)

    def cascade_decode(self, q: mx.array, k_pool: Pages, v_pool: Pages, private: PagedCsrView, levels,
                       *, scale: float, **level0) -> mx.array:
        """One cascade decode step: o [R, Hq, D] in q's dtype (prepare_cascade,
        then the call; ``level0`` takes its sweep options)."""
        step = self.prepare_cascade(AttentionShape.of(q, k_pool, scale), q.shape[0], private, levels, **level0)
        return step(q, k_pool, v_pool, private.last_page_len)
