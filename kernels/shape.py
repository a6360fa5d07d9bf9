"""What a paged attention launch depends on besides its page table: the
heads, the dtypes and the scale. A decode step's launches are prepared once
from it (tiles, template constants, grids) before the first layer runs."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from .csr import PagedCsrView


@dataclass(frozen=True)
class AttentionShape:
    q_heads: int
    kv_heads: int
    head_dim: int
    q_dtype: mx.Dtype
    pool_dtype: mx.Dtype
    block_size: int
    scale: float

    @classmethod
    def of(cls, q: mx.array, k_pool: mx.array, scale: float) -> "AttentionShape":
        """The shape of a call: q [R, Hq, D], k_pool [blocks, block_size, Hkv, D]."""
        return cls(q.shape[1], k_pool.shape[2], q.shape[-1], q.dtype, k_pool.dtype, k_pool.shape[1], scale)

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
