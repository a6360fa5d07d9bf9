"""Paged attention for one layer of one engine step.

Single-token decode steps run the paged partial kernel over page tiles plus a
merge (path ``fused_v2``); when cascade is on and the planner finds a subgroup
sharing a leading span, the step runs two levels instead (``cascade``):

- level 0: the shared span once, every member's query heads stacked onto one
  launch as ``h0 = kv_head * (M * G) + m * G + g`` (so the kernel's h // NRep
  still lands on the right KV head);
- level 1: every row over its private suffix (non-members: the whole range);
- one merge pairing each member's two states.

Multi-token steps gather pages into contiguous K/V and call
``mx.fast.scaled_dot_product_attention`` (``gather``), before cascade is consulted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel import kernels
from mlxcel.kernels import portable
from mlxcel.kernels.csr import HostCsr, PagedCsrView, PageStructure
from mlxcel.kernels.portable import page_tiles

from .cascade import CascadePlan, explain_cascade
from .config import CascadeConfig, CascadeSettings
from .metrics import CASCADE, CASCADE_FALLBACK, FLAT, GATHER, DecodeOutcome, EngineMetrics

log = logging.getLogger(__name__)


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
    """Layout-only pieces of a plan's two levels, memoized on the page structure."""

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


def build_cascade_layout(host: HostCsr, plan: CascadePlan) -> CascadeLayout:
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


def cascade_layout(csr: PagedCsrView, plan: CascadePlan) -> CascadeLayout:
    key = ("cascade_layout", tuple(plan.members), plan.shared_pages)
    layout = csr.structure.memo.get(key)
    if layout is None:
        layout = csr.structure.memo[key] = build_cascade_layout(csr.host, plan)
    return layout


def flat_launch(q: mx.array, k_pool: mx.array, v_pool: mx.array, csr: PagedCsrView, *, scale: float) -> mx.array:
    return kernels.paged_attention_partial(q, k_pool, v_pool, csr, scale=scale)[0]


def cascade_launch(q: mx.array, k_pool: mx.array, v_pool: mx.array, csr: PagedCsrView, plan: CascadePlan,
                   *, scale: float) -> mx.array:
    """Two levels and one merge. The shared span is gathered and read once for
    the whole subgroup, whatever its size."""
    layout = cascade_layout(csr, plan)
    backend = kernels.backend()
    if hasattr(backend, "cascade_decode") and backend.takes(q, k_pool):
        # A fused backend runs the same two levels and merge in three launches
        # (stacking and unstacking inside its kernels): see mlxcel/kernels/fused.py.
        return backend.cascade_decode(q, k_pool, v_pool, layout.shared, layout.private_view(csr), plan.members,
                                      scale=scale)
    num_kv_heads, members = k_pool.shape[2], len(plan.members)
    q0 = stack_member_heads(q[layout.members], num_kv_heads)
    o0, lse0 = kernels.paged_attention_partial(q0, k_pool, v_pool, layout.shared, scale=scale)
    o0, lse0 = unstack_member_heads(o0, lse0, members, num_kv_heads)
    o1, lse1 = kernels.paged_attention_partial(q, k_pool, v_pool, layout.private_view(csr), scale=scale)
    states = mx.concatenate([o1, o0])[layout.merge_order]
    lses = mx.concatenate([lse1, lse0])[layout.merge_order]
    return kernels.merge_states(states, lses, layout.merge_indptr)[0]


_logged_outcomes: set[str] = set()


def log_first_launch(outcome: DecodeOutcome) -> None:
    """Log the first launch of each distinct outcome once per process."""
    if outcome.kind in _logged_outcomes:
        return
    _logged_outcomes.add(outcome.kind)
    backend = kernels.backend_name()
    if outcome.kind == CASCADE:
        plan = outcome.plan
        log.info("paged decode v2: fused v2 cascade launch (batch %d, %d of them sharing %d pages / %d KV tokens "
                 "read once; %s kernels)", outcome.batch, len(plan.members), plan.shared_pages,
                 outcome.shared_tokens, backend)
    elif outcome.kind == CASCADE_FALLBACK:
        log.warning("paged decode v2: %s; ran the flat fused v2 launch instead (batch %d, %s kernels)",
                    outcome.reason, outcome.batch, backend)
    elif outcome.kind == FLAT:
        log.info("paged decode v2: fused v2 flat launch (batch %d; %s; %s kernels)",
                 outcome.batch, outcome.reason, backend)
    else:
        log.info("paged decode v2: gather launch (batch %d, %s; contiguous K/V + "
                 "mx.fast.scaled_dot_product_attention)", outcome.batch, outcome.reason)


def record(outcome: DecodeOutcome, metrics: EngineMetrics | None) -> None:
    log_first_launch(outcome)
    if metrics is not None:
        metrics.record_decode(outcome)


def dense_attention(q: mx.array, keys: mx.array, values: mx.array, mask: mx.array, *, scale: float) -> mx.array:
    if mx.default_device().type == mx.DeviceType.cpu:
        return portable.dense_attention(q, keys, values, mask, scale=scale)
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask)


def paged_decode_attention(q: mx.array, k_pool: mx.array, v_pool: mx.array, csr: PagedCsrView, *,
                           scale: float, config: CascadeConfig | CascadeSettings,
                           metrics: EngineMetrics | None = None) -> mx.array:
    """One layer's attention for a step: q [R, Hq, D] (or mlx-lm's [R, Hq, L, D])
    -> o of the same shape and dtype. L > 1 takes the gather path without
    consulting cascade; with cascade off the page table is not scanned."""
    if q.ndim == 4 and q.shape[2] != 1:
        return paged_prefill_attention(q, k_pool, v_pool, csr, scale=scale, metrics=metrics)
    rows = q.reshape(q.shape[0], q.shape[1], q.shape[-1])
    settings = config.snapshot() if isinstance(config, CascadeConfig) else config
    decision = explain_cascade(csr, settings) if settings.enabled else None
    plan = decision.plan if decision is not None else None
    reason = decision.reason if decision else "cascade off"
    if plan is not None:
        # The planner counts page reads; the kernels know what a cascade step
        # costs beyond them and decline plans that save less (fused kernels).
        declined = kernels.cascade_decline(rows, k_pool, plan.shared_pages, len(plan.members))
        if declined:
            plan, reason = None, declined
    batch = rows.shape[0]
    if plan is None:
        o = flat_launch(rows, k_pool, v_pool, csr, scale=scale)
        outcome = DecodeOutcome(FLAT, batch, None, 0, reason)
    else:
        shared_tokens = plan.shared_pages * csr.block_size
        try:
            o = cascade_launch(rows, k_pool, v_pool, csr, plan, scale=scale)
            outcome = DecodeOutcome(CASCADE, batch, plan, shared_tokens, decision.reason)
        except Exception as error:  # any failure of the planned launch: fall back in the same step
            o = flat_launch(rows, k_pool, v_pool, csr, scale=scale)
            outcome = DecodeOutcome(CASCADE_FALLBACK, batch, plan, shared_tokens,
                                    f"cascade launch failed ({type(error).__name__}: {error})")
    record(outcome, metrics)
    return o.astype(q.dtype).reshape(q.shape)


def paged_prefill_attention(q: mx.array, k_pool: mx.array, v_pool: mx.array, csr: PagedCsrView, *,
                            scale: float, metrics: EngineMetrics | None = None) -> mx.array:
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
    o = dense_attention(q, keys, values, mask[:, None], scale=scale)
    record(DecodeOutcome(GATHER, rows, None, 0, f"{length} query tokens per row"), metrics)
    return o
