"""Float64 NumPy references for the paged kernels: one row at a time, no
tiling, no cleverness, so every backend is checked against the plain math."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .csr import HostCsr
from .kv_quant import QuantizedPages


def dequantized(pages: QuantizedPages) -> np.ndarray:
    """The float64 keys (or values) [..., D] quantized pages hold (kv_quant's layouts)."""
    fmt = pages.format
    scales = np.array(pages.scales).astype(np.float64)
    if not fmt.affine:
        return np.array(pages.codes).astype(np.float64) * scales
    packed = np.array(pages.codes)
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1).astype(np.float64)
    grouped = codes.reshape(*codes.shape[:-1], -1, fmt.group)
    zeros = np.array(pages.zeros).astype(np.float64)
    return (grouped * scales[..., None] + zeros[..., None]).reshape(codes.shape)


def as_float64(x) -> np.ndarray:
    """NumPy float64 copy of an mx.array (any float dtype, bf16 included), of
    quantized pages (what they hold), or of an array-like."""
    if isinstance(x, QuantizedPages):
        return dequantized(x)
    if isinstance(x, mx.array):
        x = np.array(x.astype(mx.float32))
    return np.asarray(x, dtype=np.float64)


def row_tokens(pool: np.ndarray, csr: HostCsr, row: int) -> np.ndarray:
    """The [tokens, Hkv, D] keys (or values) row ``row`` attends to, in order."""
    pages = csr.pages(row)
    if len(pages) == 0:
        return pool[:0].reshape(0, *pool.shape[2:])
    flat = pool[pages].reshape(-1, *pool.shape[2:])
    start = int(csr.first_page_offset[row])
    end = (len(pages) - 1) * csr.block_size + int(csr.last_page_len[row])
    return flat[start:end]


def softmax_state(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Attention of q [Hq, D] over k, v [T, Hkv, D]: (normalized o [Hq, D], lse [Hq] log2).
    No tokens gives o = 0 and lse = -inf (weight 0 in a merge)."""
    hq, d = q.shape
    if len(k) == 0:
        return np.zeros((hq, d)), np.full(hq, -np.inf)
    group = hq // k.shape[1]
    kv_head = np.arange(hq) // group
    scores = np.einsum("hd,thd->ht", q, k[:, kv_head]) * scale
    top = scores.max(axis=1, keepdims=True)
    weights = np.exp(scores - top)
    total = weights.sum(axis=1, keepdims=True)
    o = np.einsum("ht,thd->hd", weights, v[:, kv_head]) / total
    lse = (top + np.log(total))[:, 0] / np.log(2.0)
    return o, lse


def reference_partial(q, k_pool, v_pool, host_csr: HostCsr, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """paged_attention_partial in float64: o [R, Hq, D], lse [R, Hq] (log2)."""
    q, k_pool, v_pool = as_float64(q), as_float64(k_pool), as_float64(v_pool)
    states = [
        softmax_state(q[r], row_tokens(k_pool, host_csr, r), row_tokens(v_pool, host_csr, r), scale)
        for r in range(host_csr.num_rows)
    ]
    return np.stack([s[0] for s in states]), np.stack([s[1] for s in states])


def reference_merge(v_in, lse_in, o_indptr) -> tuple[np.ndarray, np.ndarray]:
    """merge_states in float64: groups of contiguous states, empty groups give o = 0, lse = -inf."""
    v_in, lse_in = as_float64(v_in), as_float64(lse_in)
    indptr = np.asarray(o_indptr, dtype=np.int64)
    outs, lses = [], []
    for start, end in zip(indptr[:-1], indptr[1:]):
        lse = lse_in[start:end]
        top = lse.max(axis=0) if end > start else np.full(lse_in.shape[1:], -np.inf)
        safe_top = np.where(np.isfinite(top), top, 0.0)
        weights = np.exp2(lse - safe_top)
        total = weights.sum(axis=0)
        mixed = np.einsum("nh,nhd->hd", weights, np.nan_to_num(v_in[start:end]))
        outs.append(np.where(total[:, None] > 0, mixed / np.where(total > 0, total, 1.0)[:, None], 0.0))
        with np.errstate(divide="ignore"):
            lses.append(safe_top + np.log2(total))
    return np.stack(outs), np.stack(lses)


def reference_decode(q, k_pool, v_pool, host_csr: HostCsr, scale: float) -> np.ndarray:
    """Single-token decode over each row's whole range: o [R, Hq, D]."""
    return reference_partial(q, k_pool, v_pool, host_csr, scale)[0]


def reference_prefill(q, k_pool, v_pool, host_csr: HostCsr, scale: float) -> np.ndarray:
    """Multi-token step: q [R, Hq, L, D] are each row's last L tokens, causal. o [R, Hq, L, D]."""
    q, k_pool, v_pool = as_float64(q), as_float64(k_pool), as_float64(v_pool)
    rows, _, length, _ = q.shape
    out = np.zeros_like(q)
    for r in range(rows):
        k, v = row_tokens(k_pool, host_csr, r), row_tokens(v_pool, host_csr, r)
        for i in range(length):
            visible = len(k) - length + i + 1
            out[r, :, i] = softmax_state(q[r, :, i], k[:visible], v[:visible], scale)[0]
    return out
