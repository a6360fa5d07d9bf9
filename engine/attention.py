"""Paged attention launches for one page layout, prepared once and called by
every layer.

Single-token decode steps run the paged partial kernel over page tiles plus a
merge (``prepare_flat_launch``); a cascade plan runs its levels instead
(``prepare_cascade_launch``):

- one launch per depth of the plan: every span at that depth (disjoint
  members, any number of groups) is one row over its pages, with its members'
  query heads stacked onto it as ``h0 = kv_head * (M * G) + m * G + g`` (so
  the kernel's h // NRep still lands on the right KV head; M is the widest
  span's members, narrower spans pad);
- the private level: every row over the pages after its last span
  (non-members: the whole range);
- one merge folding each row's states: its private one and one per span it
  is a member of.

The launch count is the plan's depth plus two, whatever the number of
groups. A fused backend runs the whole cascade in its own launches; otherwise
the levels are composed here from the backend's partial and merge launches.
Multi-token steps gather pages into contiguous K/V and run a dense causal
attention (``paged_prefill_attention``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Callable, Protocol, runtime_checkable

import mlx.core as mx
import numpy as np

from mlxcel import kernels
from mlxcel.kernels import AttentionShape
from mlxcel.kernels import portable
from mlxcel.kernels.csr import HostCsr, PagedCsrView, PageStructure, upload
from mlxcel.kernels.kv_quant import PageGather, Pages, read_pages
from mlxcel.kernels.portable import page_tiles

from .cascade import CascadePlan, SharedSpan


def stack_member_heads(q_members: mx.array, num_kv_heads: int) -> mx.array:
    """[S, M, Hq, D] (or [M, Hq, D], one span) -> [S, Hkv * M * G, D],
    kv-head-major ([M, Hkv, G] -> [Hkv, M, G] per span)."""
    if q_members.ndim == 3:
        q_members = q_members[None]
    spans, members, hq, d = q_members.shape
    group = hq // num_kv_heads
    stacked = q_members.reshape(spans, members, num_kv_heads, group, d).transpose(0, 2, 1, 3, 4)
    return stacked.reshape(spans, hq * members, d)


def unstack_member_heads(o: mx.array, lse: mx.array, members: int, num_kv_heads: int) -> tuple[mx.array, mx.array]:
    """Inverse of stack_member_heads on a level's states: [S * M, Hq, D], [S * M, Hq]."""
    spans, stacked, d = o.shape
    hq = stacked // members
    group = hq // num_kv_heads
    o = o.reshape(spans, num_kv_heads, members, group, d).transpose(0, 2, 1, 3, 4).reshape(spans * members, hq, d)
    lse = lse.reshape(spans, num_kv_heads, members, group).transpose(0, 2, 1, 3).reshape(spans * members, hq)
    return o, lse


@dataclass(frozen=True)
class SpanLevel:
    """One depth of a plan as one launch: a row per span over its pages (all
    full), and the member rows whose heads are stacked onto each."""

    spans: tuple[SharedSpan, ...]
    view: PagedCsrView
    members: np.ndarray         # [spans, width] member rows, -1 past a span's own members
    stacked_rows: mx.array      # [spans * width] the rows whose q is stacked (padding repeats a span's first)

    @property
    def width(self) -> int:
        return self.members.shape[1]


@dataclass(frozen=True)
class CascadeLayout:
    """A plan's levels over one page layout."""

    levels: tuple[SpanLevel, ...]
    private_host: HostCsr       # every row after its last span (last_page_len replaced each step)
    private_device: tuple[mx.array, mx.array, mx.array]  # its indptr, indices, first_page_offset
    private_structure: PageStructure
    merge_order: mx.array       # states of [private; level 0; level 1; ...] grouped per output row
    merge_indptr: np.ndarray    # [R+1]

    @property
    def kernel_levels(self) -> list[tuple[PagedCsrView, np.ndarray]]:
        """The levels as kernels.prepare_cascade takes them."""
        return [(level.view, level.members) for level in self.levels]

    def private_view(self, csr: PagedCsrView) -> PagedCsrView:
        """The private level for this step (each row's last-page fill from ``csr``)."""
        h = self.private_host
        host = HostCsr(h.indptr, h.indices, csr.host.last_page_len, h.first_page_offset, h.block_size)
        indptr, indices, first = self.private_device
        return PagedCsrView(indptr, indices, csr.last_page_len, first, h.block_size, self.private_structure, host)


def span_level(host: HostCsr, spans: tuple[SharedSpan, ...]) -> SpanLevel:
    width = max(len(s.members) for s in spans)
    members = np.full((len(spans), width), -1, np.int32)
    for i, span in enumerate(spans):
        members[i, :len(span.members)] = span.members
    pages = [host.pages(s.members[0])[s.start:s.end] for s in spans]
    indptr = np.zeros(len(spans) + 1, np.int32)
    np.cumsum([s.pages for s in spans], out=indptr[1:])
    view = PagedCsrView.from_host(HostCsr(indptr, np.concatenate(pages).astype(np.int32),
                                          np.full(len(spans), host.block_size, np.int32),
                                          np.zeros(len(spans), np.int32), host.block_size))
    stacked = np.where(members >= 0, members, members[:, :1])
    return SpanLevel(spans, view, members, mx.array(stacked.reshape(-1)))


def private_level(host: HostCsr, plan: CascadePlan) -> HostCsr:
    """Every row's pages after its last span."""
    skip = np.zeros(host.num_rows, np.int64)
    for span in plan.spans:
        members = list(span.members)
        skip[members] = np.maximum(skip[members], span.end)
    pages = host.num_pages()
    row_of = np.repeat(np.arange(host.num_rows), pages)
    keep = np.arange(len(host.indices)) - host.indptr[:-1][row_of] >= skip[row_of]
    indptr = np.zeros(host.num_rows + 1, np.int32)
    np.cumsum(pages - skip, out=indptr[1:])
    return HostCsr(indptr, host.indices[keep], host.last_page_len, host.first_page_offset, host.block_size)


# The private level's page ids go to the device padded to a power of two of at least this many: the rows'
# suffixes grow a page every few steps, and a trace of the launches (layer_halves) replays only while the
# arrays keep their shapes. Kernels read a row's pages through indptr / the tiles, never the padding.
MIN_PRIVATE_INDICES = 256


def padded_indices(indices: np.ndarray) -> np.ndarray:
    size = max(MIN_PRIVATE_INDICES, 1 << max(len(indices) - 1, 0).bit_length())
    padded = np.zeros(size, indices.dtype)   # np.pad costs ~8x this here (0.07 ms a step on a 2-core host)
    padded[:len(indices)] = indices
    return padded


def levels_key(csr: PagedCsrView, plan: CascadePlan) -> tuple:
    """What a plan's levels depend on: its spans, their block ids and the row
    count. Layouts with the same key differ only in their private level."""
    host = csr.host
    return host.num_rows, tuple((s, host.pages(s.members[0])[s.start:s.end].tobytes()) for s in plan.spans)


def cascade_layout(csr: PagedCsrView, plan: CascadePlan, kept: CascadeLayout | None = None) -> CascadeLayout:
    """The plan's levels over this layout; ``kept``: a layout of the same
    levels (levels_key), whose levels and merge order are reused."""
    host = csr.host
    private = private_level(host, plan)
    private_arrays = dict(
        private_host=private,
        private_device=upload(private.indptr, padded_indices(private.indices), private.first_page_offset),
        private_structure=PageStructure())
    if kept is not None:
        return replace(kept, **private_arrays)
    rows = host.num_rows
    levels = tuple(span_level(host, spans) for spans in plan.levels)
    states = [[r] for r in range(rows)]          # each row's states: private first, then outermost span on
    offset = rows
    for level in levels:
        for (span, slot), member in np.ndenumerate(level.members):
            if member >= 0:
                states[member].append(offset + span * level.width + slot)
        offset += level.members.size
    merge_indptr = np.zeros(rows + 1, np.int64)
    np.cumsum([len(s) for s in states], out=merge_indptr[1:])
    return CascadeLayout(levels=levels, merge_order=mx.array(np.concatenate(states).astype(np.int32)),
                         merge_indptr=merge_indptr, **private_arrays)


Launch = Callable[[mx.array, mx.array, mx.array, mx.array], mx.array]


def traceable(*launches) -> bool:
    """Whether a trace can take these backend launches: the portable ones (their arrays as inputs), on the CPU.
    A GPU runs them only for shapes its fused kernels do not take, and whether a trace of them keeps the
    untraced logits bit for bit there (its fused kernels round as their own code does) is not tested."""
    return mx.default_device().type == mx.DeviceType.cpu and all(
        isinstance(launch, (portable.PartialLaunch, portable.MergeLaunch)) for launch in launches)


@dataclass(frozen=True)
class FlatLaunch:
    """The flat launch over every row's whole range: (q, k_pool, v_pool, last_page_len) -> o in q's dtype.
    Traceable (``TraceableAttention``) where the backend's partial launch is (the portable one's)."""

    partial: Callable

    def __call__(self, q: mx.array, k_pool: Pages, v_pool: Pages, last_page_len: mx.array) -> mx.array:
        return self.partial(q, k_pool, v_pool, last_page_len)[0].astype(q.dtype)

    @cached_property
    def signature(self) -> tuple | None:   # read by every layer's trace lookup
        return (type(self).__name__, self.partial.signature) if traceable(self.partial) else None

    def arrays(self) -> tuple[mx.array, ...]:
        return self.partial.arrays()

    def rebind(self, arrays) -> "FlatLaunch":
        return FlatLaunch(self.partial.rebind(arrays))


def prepare_flat_launch(csr: PagedCsrView, shape: AttentionShape) -> FlatLaunch:
    return FlatLaunch(kernels.prepare_partial(csr, shape))


@dataclass(frozen=True)
class ComposedCascade:
    """The levels and the merge as separate backend launches: per depth stack
    the members' heads, attend, unstack; the private level; reorder, merge."""

    layout: CascadeLayout
    levels: tuple[Callable, ...]
    private: Callable
    merge: Callable
    kv_heads: int

    def __call__(self, q: mx.array, k_pool: mx.array, v_pool: mx.array, last_page_len: mx.array) -> mx.array:
        _, hq, d = q.shape
        o, lse = self.private(q, k_pool, v_pool, last_page_len)
        states, lses = [o], [lse]
        for level, launch in zip(self.layout.levels, self.levels):
            q_level = q[level.stacked_rows].reshape(len(level.spans), level.width, hq, d)
            o, lse = launch(stack_member_heads(q_level, self.kv_heads), k_pool, v_pool, level.view.last_page_len)
            o, lse = unstack_member_heads(o, lse, level.width, self.kv_heads)
            states.append(o)
            lses.append(lse)
        order = self.layout.merge_order
        return self.merge(mx.concatenate(states)[order], mx.concatenate(lses)[order])[0].astype(q.dtype)

    @property
    def launches(self) -> tuple:
        return (self.private, *self.levels, self.merge)

    @cached_property
    def signature(self) -> tuple | None:
        """None where the backend's launches are not traceable; else what a trace bakes in besides the arrays'
        shapes: the launches' signatures, each level's spans and width, the KV heads."""
        if not traceable(*self.launches):
            return None
        levels = tuple((len(level.spans), level.width) for level in self.layout.levels)
        return type(self).__name__, tuple(launch.signature for launch in self.launches), levels, self.kv_heads

    def arrays(self) -> tuple[mx.array, ...]:
        """The launches' arrays, then each level's stacked rows and last-page fill, then the merge order."""
        levels = (a for level in self.layout.levels for a in (level.stacked_rows, level.view.last_page_len))
        return (*(a for launch in self.launches for a in launch.arrays()), *levels, self.layout.merge_order)

    def rebind(self, arrays) -> "ComposedCascade":
        arrays, at = list(arrays), 0
        launches = []
        for launch in self.launches:
            count = len(launch.arrays())
            launches.append(launch.rebind(arrays[at:at + count]))
            at += count
        levels = []
        for level in self.layout.levels:
            stacked_rows, last_page_len = arrays[at:at + 2]
            levels.append(replace(level, stacked_rows=stacked_rows, view=replace(level.view,
                                                                                 last_page_len=last_page_len)))
            at += 2
        private, *partials, merge = launches
        layout = replace(self.layout, levels=tuple(levels), merge_order=arrays[at])
        return ComposedCascade(layout, tuple(partials), private, merge, self.kv_heads)


@runtime_checkable
class TraceableAttention(Protocol):
    """An attention launch a trace can take: its arrays as inputs, the rest fixed by its signature (None:
    this one cannot be traced, its backend's launches are not)."""

    signature: tuple | None

    def arrays(self) -> tuple[mx.array, ...]: ...

    def rebind(self, arrays) -> "TraceableAttention": ...

    def __call__(self, q: mx.array, k_pool: Pages, v_pool: Pages, last_page_len: mx.array) -> mx.array: ...


@dataclass(frozen=True)
class CascadeLaunch:
    """A plan's prepared launches over one layout, and what of them the next
    layout with the same levels keeps (a row's private suffix grew by a
    page: only the private level and the merge are prepared again)."""

    key: tuple
    layout: CascadeLayout
    run: Launch                 # a fused backend's cascade, or ComposedCascade

    def __call__(self, q: mx.array, k_pool: mx.array, v_pool: mx.array, last_page_len: mx.array) -> mx.array:
        return self.run(q, k_pool, v_pool, last_page_len)


def prepare_cascade_launch(csr: PagedCsrView, plan: CascadePlan, shape: AttentionShape,
                           previous: CascadeLaunch | None = None) -> CascadeLaunch:
    """The cascade launch of ``plan`` over this layout: (q, k_pool, v_pool,
    last_page_len) -> o in q's dtype. Every span is read once for all its
    members, whatever their number. ``previous``: the last step's launch, of
    the same shape; its levels are kept when this plan's are the same."""
    key = levels_key(csr, plan)
    kept = previous if previous is not None and previous.key == key else None
    layout = cascade_layout(csr, plan, kept.layout if kept else None)
    private = layout.private_view(csr)
    fused = kernels.prepare_cascade(shape, csr.num_rows, private, layout.kernel_levels,
                                    kept.run if kept and not isinstance(kept.run, ComposedCascade) else None)
    if fused is not None:
        return CascadeLaunch(key, layout, fused)
    levels = (kept.run.levels if kept else
              tuple(kernels.prepare_partial(lv.view, shape.stacked(lv.width)) for lv in layout.levels))
    merge = kept.run.merge if kept else kernels.prepare_merge(layout.merge_indptr, shape.head_dim)
    return CascadeLaunch(key, layout, ComposedCascade(layout, levels, kernels.prepare_partial(private, shape), merge,
                                                      shape.kv_heads))


# Scores a prefill chunk's attention holds at once, in elements: [rows, Hq, L, T] unblocked, 8.6 GB in float32
# for 2,048 query tokens over a 32K context at 32 heads, a layer. Query tokens are attended in blocks whose
# scores stay under this; each token's softmax is its own.
PREFILL_SCORE_ELEMENTS = 1 << 28
# On the CPU a causal chunk's query tokens are attended in blocks of this many, each over the keys up to its
# last token: the masked scores past them are neither computed nor exponentiated (a 512-token chunk after 512
# cached tokens, SmolLM2's heads: 44 against 73 ms a layer here).
CPU_QUERY_BLOCK = 128


def masked_attention(q: mx.array, keys: mx.array, values: mx.array, mask: mx.array, *, scale: float) -> mx.array:
    """MLX's own unfused scaled_dot_product_attention (its ops fallback) for a GPU: there a masked multi-token
    query goes to cuDNN, whose prefill of a 32K prompt on an 8B-shaped model took an H100's 80 GB at ~24K tokens
    (peak 73 GB within one 2,048-token chunk's step) where these ops peaked at 33 GB, in the same time a chunk.
    Not portable.dense_attention: its float32 operands would put a GPU's matmuls in float32.
    q [R, Hq, L, D], keys and values [R, Hkv, T, D], mask [R, 1, L, T]."""
    rows, heads, length, d = q.shape
    kv_heads = keys.shape[1]
    grouped = (q * scale).reshape(rows, kv_heads, heads // kv_heads, length, d)
    scores = grouped @ keys[:, :, None].swapaxes(-1, -2)                          # [R, Hkv, G, L, T]
    weights = mx.softmax(mx.where(mask[:, :, None], scores, -mx.inf), axis=-1, precise=True)
    return (weights @ values[:, :, None]).reshape(rows, heads, length, d)


def dense_attention(q: mx.array, keys: mx.array, values: mx.array, mask: mx.array, *, scale: float,
                    last_key: int | None = None) -> mx.array:
    """q [R, Hq, L, D] over keys and values [R, Hkv, T, D] where mask [R, 1, L, T] allows, in blocks of query
    tokens (PREFILL_SCORE_ELEMENTS). ``last_key`` (a causal chunk): the last slot any row's last query token
    sees, so query token i sees none past last_key - (L - 1 - i); on the CPU each block of CPU_QUERY_BLOCK
    query tokens then attends only the keys up to its own last token's."""
    rows, heads, length, _ = q.shape
    on_cpu = mx.default_device().type == mx.DeviceType.cpu
    attend = portable.dense_attention if on_cpu else masked_attention
    causal = on_cpu and last_key is not None
    block = max(1, PREFILL_SCORE_ELEMENTS // (rows * heads * keys.shape[2]))
    if causal:
        block = min(block, CPU_QUERY_BLOCK)
    elif length <= block:
        return attend(q, keys, values, mask, scale=scale)
    outputs = []
    for start in range(0, length, block):
        end = min(start + block, length)
        seen = min(keys.shape[2], last_key - (length - end) + 1) if causal else keys.shape[2]
        outputs.append(attend(q[:, :, start:end], keys[:, :, :seen], values[:, :, :seen],
                              mask[:, :, start:end, :seen], scale=scale))
    return outputs[0] if len(outputs) == 1 else mx.concatenate(outputs, axis=2)


def paged_prefill_attention(q: mx.array, k_pool: mx.array, v_pool: mx.array, csr: PagedCsrView, *,
                            scale: float, stored_with: mx.array | None = None) -> mx.array:
    """Multi-token step: q [R, Hq, L, D] are each row's last L tokens (their K/V
    already written to the pool), causal. Pages are gathered into contiguous
    K/V (a quantized pool's dequantized) for dense_attention. ``stored_with``:
    the output of the kernel that wrote them in place, which the gathers then
    follow. Returns [R, Hq, L, D] in q's dtype."""
    length = q.shape[2]
    host = csr.host
    tokens = host.num_tokens()
    if (tokens < length).any():
        raise ValueError(f"every row needs at least its {length} query tokens in the pool")
    tiles = page_tiles(csr, chunk_pages=int(host.num_pages().max()))   # one tile per row
    block_size, num_kv_heads = k_pool.shape[1], k_pool.shape[2]
    slots = tiles.width * block_size
    at = PageGather.of(tiles.pages, block_size, num_kv_heads)
    if stored_with is not None:
        at = at.after(stored_with)
    keys, values = read_pages(k_pool, at, q.dtype), read_pages(v_pool, at, q.dtype)   # [R, Hkv, slots, D]

    newest = tiles.full_slots - (block_size - csr.last_page_len) - 1           # slot of each row's last token
    visible = newest[:, None] - (length - 1) + mx.arange(length, dtype=mx.int32)  # [R, L] causal limit
    slot = mx.arange(slots, dtype=mx.int32)
    mask = (slot >= tiles.first_slot[:, None, None]) & (slot <= visible[:, :, None])
    last_key = int((host.first_page_offset + tokens).max()) - 1        # the largest newest, from the host's counts
    return dense_attention(q, keys, values, mask[:, None], scale=scale, last_key=last_key)
