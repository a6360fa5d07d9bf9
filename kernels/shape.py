"""What a paged attention launch depends on besides its page table: the
heads, the dtypes and the scale. A decode step's launches are prepared once
from it (tiles, template constants, grids) before the first layer runs."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from .csr import PagedCsrView
from .kv_quant import BY_CODE_DTYPE, KVQuant


@dataclass(frozen=True)
class AttentionShape:
    q_heads: int
    kv_heads: int
    head_dim: int
    q_dtype: mx.Dtype
    pool_dtype: mx.Dtype    # a float pool's dtype, or a quantized pool's codes' (int8: int8, int4: uint8)
    block_size: int
    scale: float

    @classmethod
    def of(cls, q: mx.array, k_pool: mx.array, scale: float) -> "AttentionShape":
        """The shape of a call: q [R, Hq, D], k_pool [blocks, block_size, Hkv, D]."""
        return cls(q.shape[1], k_pool.shape[2], q.shape[-1], q.dtype, k_pool.dtype, k_pool.shape[1], scale)

    @property
    def kv_quant(self) -> KVQuant | None:
        """The quantized page format, None for float pages."""
        return BY_CODE_DTYPE.get(self.pool_dtype)

    @property
    def page_bytes(self) -> int:
        """K and V bytes of one page (one layer), scales included."""
        quant = self.kv_quant
        token = quant.token_bytes(self.head_dim) if quant else self.head_dim * self.pool_dtype.size
        return 2 * self.block_size * self.kv_heads * token

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    def stacked(self, members: int) -> "AttentionShape":
        """Cascade level 0: every member's query heads on one row."""
        return AttentionShape(self.q_heads * members, self.kv_heads, self.head_dim, self.q_dtype,
                              self.pool_dtype, self.block_size, self.scale)


def check_inputs(q: mx.array, k_pool: mx.array, csr: PagedCsrView) -> None:
    rows, hq = q.shape[0], q.shape[1]
    if rows != csr.num_rows:
        raise ValueError(f"q has {rows} rows but the page table has {csr.num_rows}")
    if hq % k_pool.shape[2]:
        raise ValueError(f"{hq} query heads are not a multiple of {k_pool.shape[2]} KV heads")
