"""Paged attention launches for one page layout, prepared once and called by
every layer.

Single-token decode steps run the paged partial kernel over page tiles plus a
merge (``prepare_flat_launch``); a cascade plan runs two levels instead
(``prepare_cascade_launch``):

- level 0: the shared span once, every member's query heads stacked onto one
  launch as ``h0 = kv_head * (M * G) + m * G + g`` (so the kernel's h // NRep
  still lands on the right KV head);
- level 1: every row over its private suffix (non-members: the whole range);
- one merge pairing each member's two states.

A fused backend runs the whole cascade in its own three launches; otherwise
the levels are composed here from the backend's partial and merge launches.
Multi-token steps gather pages into contiguous K/V and run a dense causal
attention (``paged_prefill_attention``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
import numpy as np

from mlxcel import kernels
from mlxcel.kernels import AttentionShape
from mlxcel.kernels import portable
from mlxcel.kernels.csr import HostCsr, PagedCsrView, PageStructure
from mlxcel.kernels.portable import page_tiles

from .cascade import CascadePlan


def stack_member_heads(q_members: mx.array, num_kv_heads: int) -> mx.array:
    """[M, Hq, D] -> [1, Hkv * M * G, D], kv-head-major ([M, Hkv, G] -> [Hkv, M, G])."""
    members, hq, d = q_members.shape
    group = hq // num_kv_heads
    return q_members.reshape(members, num_kv_heads, group, d).transpose(1, 0, 2, 3).reshape(1, hq * members, d)


def unstack_member_heads(o: mx.array, lse: mx.array, members: int, num_kv_heads: int) -> tuple[mx.array, mx.array]:
    """Inverse of stack_member_heads on level-0 states: [M, Hq, D], [M, Hq]."""
    stacked, d = o.shape[1], o.shape[2]
    hq = stacked // members
    group = hq // num_kv_heads
    o = o.reshape(num_kv_heads, members, group, d).transpose(1, 0, 2, 3).reshape(members, hq, d)
    lse = lse.reshape(num_kv_heads, members, group).transpose(1, 0, 2).reshape(members, hq)
    return o, lse


@dataclass(frozen=True)
class CascadeLayout:
    """The two levels of a plan over one page layout."""

    members: mx.array                 # [M] member rows
    shared: PagedCsrView              # one row over the shared pages, all full
    private_host: HostCsr             # level 1 (last_page_len replaced each step)
    private_device: tuple[mx.array, mx.array, mx.array]  # its indptr, indices, first_page_offset
    private_structure: PageStructure
    merge_order: mx.array             # rows of [level 1; level 0] grouped per output row
    merge_indptr: np.ndarray          # [R+1]

    def private_view(self, csr: PagedCsrView) -> PagedCsrView:
        """Level 1 for this step: every row's range minus the members' shared span."""
        h = self.private_host
        host = HostCsr(h.indptr, h.indices, csr.host.last_page_len, h.first_page_offset, h.block_size)
        indptr, indices, first = self.private_device
        return PagedCsrView(indptr, indices, csr.last_page_len, first, h.block_size, self.private_structure, host)


def cascade_layout(csr: PagedCsrView, plan: CascadePlan) -> CascadeLayout:
    host = csr.host
    rows, members, span = host.num_rows, np.asarray(plan.members), plan.shared_pages
    skip = np.zeros(rows, np.int64)
    skip[members] = span
    keep = np.ones(len(host.indices), bool)
    for m in members:
        keep[host.indptr[m]: host.indptr[m] + span] = False
    indptr = np.zeros(rows + 1, np.int32)
    np.cumsum(host.num_pages() - skip, out=indptr[1:])
    private = HostCsr(indptr, host.indices[keep], host.last_page_len, host.first_page_offset, host.block_size)

    shared_pages = host.pages(int(members[0]))[:span]
    shared = PagedCsrView.from_host(HostCsr(
        np.array([0, span], np.int32), shared_pages.astype(np.int32), np.array([host.block_size], np.int32),
        np.zeros(1, np.int32), host.block_size))

    level0_slot = np.full(rows, -1)
    level0_slot[members] = rows + np.arange(len(members))
    order = [s for r in range(rows) for s in ((r, level0_slot[r]) if level0_slot[r] >= 0 else (r,))]
    merge_indptr = np.zeros(rows + 1, np.int64)
    np.cumsum(np.where(level0_slot >= 0, 2, 1), out=merge_indptr[1:])
    return CascadeLayout(
        members=mx.array(members.astype(np.int32)),
        shared=shared,
        private_host=private,
        private_device=(mx.array(private.indptr), mx.array(private.indices), mx.array(private.first_page_offset)),
        private_structure=PageStructure(),
        merge_order=mx.array(np.array(order, np.int32)),
        merge_indptr=merge_indptr,
    )


Launch = Callable[[mx.array, mx.array, mx.array, mx.array], mx.array]


def prepare_flat_launch(csr: PagedCsrView, shape: AttentionShape) -> Launch:
    """The flat launch over every row's whole range: (q, k_pool, v_pool, last_page_len) -> o in q's dtype."""
    partial = kernels.prepare_partial(csr, shape)
    return lambda q, k_pool, v_pool, last_page_len: partial(q, k_pool, v_pool, last_page_len)[0].astype(q.dtype)


@dataclass(frozen=True)
class ComposedCascade:
    """The two levels and the merge as separate backend launches: stack the
    members' heads, level 0, unstack, level 1, reorder, merge."""

    layout: CascadeLayout
    level0: Callable
    level1: Callable
    merge: Callable
    kv_heads: int

    def __call__(self, q: mx.array, k_pool: mx.array, v_pool: mx.array, last_page_len: mx.array) -> mx.array:
        layout, members = self.layout, self.layout.members.shape[0]
        q0 = stack_member_heads(q[layout.members], self.kv_heads)
        o0, lse0 = self.level0(q0, k_pool, v_pool, layout.shared.last_page_len)
        o0, lse0 = unstack_member_heads(o0, lse0, members, self.kv_heads)
        o1, lse1 = self.level1(q, k_pool, v_pool, last_page_len)
        states = mx.concatenate([o1, o0])[layout.merge_order]
        lses = mx.concatenate([lse1, lse0])[layout.merge_order]
        return self.merge(states, lses)[0].astype(q.dtype)


def prepare_cascade_launch(csr: PagedCsrView, plan: CascadePlan, shape: AttentionShape) -> Launch:
    """The cascade launch of ``plan`` over this layout: (q, k_pool, v_pool,
    last_page_len) -> o in q's dtype. The shared span is read once for the
    whole subgroup, whatever its size."""
    layout = cascade_layout(csr, plan)
    private = layout.private_view(csr)
    fused = kernels.prepare_cascade(shape, csr.num_rows, layout.shared, private, plan.members)
    if fused is not None:
        return fused
    members = len(plan.members)
    return ComposedCascade(layout,
                           kernels.prepare_partial(layout.shared, shape.stacked(members)),
                           kernels.prepare_partial(private, shape),
                           kernels.prepare_merge(layout.merge_indptr, shape.head_dim),
                           shape.kv_heads)


def dense_attention(q: mx.array, keys: mx.array, values: mx.array, mask: mx.array, *, scale: float) -> mx.array:
    if mx.default_device().type == mx.DeviceType.cpu:
        return portable.dense_attention(q, keys, values, mask, scale=scale)
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask)


def paged_prefill_attention(q: mx.array, k_pool: mx.array, v_pool: mx.array, csr: PagedCsrView, *,
                            scale: float) -> mx.array:
    """Multi-token step: q [R, Hq, L, D] are each row's last L tokens (their K/V
    already written to the pool), causal. Pages are gathered into contiguous
    K/V for mx.fast.scaled_dot_product_attention (on the CPU, where MLX runs that
    unfused, the same steps with a faster softmax). Returns [R, Hq, L, D] in q's dtype."""
    rows, _, length, d = q.shape
    host = csr.host
    if (host.num_tokens() < length).any():
        raise ValueError(f"every row needs at least its {length} query tokens in the pool")
    tiles = page_tiles(csr, chunk_pages=int(host.num_pages().max()))   # one tile per row
    block_size, num_kv_heads = k_pool.shape[1], k_pool.shape[2]
    slots = tiles.width * block_size
    heads = mx.arange(num_kv_heads, dtype=mx.int32)[None, :, None]
    keys = k_pool[tiles.pages, :, heads, :].reshape(rows, num_kv_heads, slots, d).astype(q.dtype)
    values = v_pool[tiles.pages, :, heads, :].reshape(rows, num_kv_heads, slots, d).astype(q.dtype)

    newest = tiles.full_slots - (block_size - csr.last_page_len) - 1           # slot of each row's last token
    visible = newest[:, None] - (length - 1) + mx.arange(length, dtype=mx.int32)  # [R, L] causal limit
    slot = mx.arange(slots, dtype=mx.int32)
    mask = (slot >= tiles.first_slot[:, None, None]) & (slot <= visible[:, :, None])
    return dense_attention(q, keys, values, mask[:, None], scale=scale)
