"""CPU spelling of the layer ops (``layer_ops``): MLX's ops, fewer of them.

On the CPU ``mx.fast.rms_norm`` and ``mx.fast.rope`` are not kernels: MLX
builds them from its ops at every call (a norm ~11 graph nodes, a rope ~25),
and the host builds every node of a step's graph one by one. ``split_heads``
spells the q/k heads' work with fewer:

- one norm over q's and k's heads side by side, each head scaled by its own
  norm's weight (Qwen3's two per-head norms are one);
- the rope as ``x * cos + rotate_half(x) * sin``, its tables made once a step
  for every layer (``RotaryTables``) by MLX's own rope (of a unit vector, whose
  rotation is the table itself), the sin table signed for the rotated half;
  traced layers take them as inputs (``step_rope``). The tables' ops are one
  trace (``mx.compile``): ~10 us a step where building them cost ~60.

Each output is the composed ops' bit for bit (the same ops on the same values:
a product with 0 or 1 is exact, and so are the sum's order and the negated sin).
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from .layer_ops import ComposedOps, HeadSplit, PoolSlots


class RotaryTables:
    """One step's rope tables for the rows' positions: cos and the signed sin
    [T, heads, D] (broadcast over the heads: a multiply by them adds no node)."""

    def __init__(self, cos: mx.array, signed_sin: mx.array) -> None:
        self.cos, self.signed_sin = cos, signed_sin

    @classmethod
    def at(cls, rope, positions: mx.array, heads: int, head_dim: int, dtype: mx.Dtype) -> "RotaryTables":
        half = head_dim // 2
        unit = mx.concatenate([mx.ones((1, 1, 1, half), dtype), mx.zeros((1, 1, 1, half), dtype)], axis=-1)
        rows = positions.shape[0]
        # MLX's rope of (1, 0) pairs is (cos, sin) as its own rope computes and rounds them.
        table = rope(mx.broadcast_to(unit, (rows, 1, 1, head_dim)), offset=positions).reshape(rows, 1, head_dim)
        cos, sin = table[..., :half], table[..., half:]
        shape = (rows, heads, head_dim)
        return cls(mx.broadcast_to(mx.concatenate([cos, cos], axis=-1), shape),
                   mx.broadcast_to(mx.concatenate([-sin, sin], axis=-1), shape))

    def arrays(self) -> tuple[mx.array, mx.array]:
        return self.cos, self.signed_sin

    def rotate(self, x: mx.array) -> mx.array:
        """x [T, heads, D] roped (the half-split pairs: i with i + D/2)."""
        half = x.shape[-1] // 2
        return x * self.cos + mx.concatenate([x[..., half:], x[..., :half]], axis=-1) * self.signed_sin


def rms_norm_heads(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    """mx.fast.rms_norm's composed ops over x [T, H, D] with a weight per head [H, D] of x's dtype."""
    normed = x.astype(mx.float32)
    normed = normed * mx.rsqrt(mx.mean(mx.square(normed), axis=-1, keepdims=True) + eps)
    return normed.astype(x.dtype) * weight


class CpuOps(ComposedOps):
    """MLX's ops where ``mx.fast`` falls back to them: ``split_heads`` in fewer graph nodes. The rope tables
    of one step's positions are kept until the next step's (the layers read the same positions array), and
    given to a traced layer as its inputs (``step_rope``): made inside the trace, every layer's replay would
    make them again."""

    def __init__(self) -> None:
        self._tables: tuple[object, mx.array, RotaryTables] | None = None   # (rope key, positions, tables)
        self._traced: dict[tuple, Callable] = {}    # RotaryTables.at traced, per (rope key, heads, dtype)

    @staticmethod
    def _splits(heads: HeadSplit, dtype: mx.Dtype) -> bool:
        """Whether split_heads spells these heads' work itself (a half-split rope of known frequencies, q/k
        norms alike of the activations' dtype)."""
        return (heads.frequencies is not None and not heads.frequencies[2] and heads.norms_agree()
                and (heads.q_norm is None or heads.q_norm.weight.dtype == dtype))

    def step_rope(self, heads: HeadSplit, positions: mx.array, dtype: mx.Dtype) -> tuple[mx.array, mx.array] | None:
        # Asked in every layer: the kept tables first (split_heads ignores them where it does not split).
        count = heads.n_heads + heads.n_kv_heads
        tables = self._kept(heads, positions, count, dtype)
        if tables is None:
            if not self._splits(heads, dtype):
                return None
            tables = self.tables(heads, positions, count, dtype)
        return tables.arrays()

    def split_heads(self, heads: HeadSplit, qkv: mx.array, positions: mx.array, slots: PoolSlots | None = None,
                    rope: tuple[mx.array, mx.array] | None = None) -> tuple[mx.array, mx.array | None, mx.array | None]:
        if not self._splits(heads, qkv.dtype):
            return super().split_heads(heads, qkv, positions, slots)
        hq, qk_heads = heads.n_heads, heads.n_heads + heads.n_kv_heads
        split = qkv.reshape(qkv.shape[0], qk_heads + heads.n_kv_heads, heads.head_dim)
        qk, v = split[:, :qk_heads], split[:, qk_heads:]
        if heads.q_norm is not None:
            weight = mx.concatenate([mx.broadcast_to(heads.q_norm.weight, (hq, heads.head_dim)),
                                     mx.broadcast_to(heads.k_norm.weight, (qk_heads - hq, heads.head_dim))])
            qk = rms_norm_heads(qk, weight, heads.q_norm.eps)
        tables = RotaryTables(*rope) if rope is not None else self.tables(heads, positions, qk_heads, qk.dtype)
        qk = tables.rotate(qk)
        return qk[:, :hq], qk[:, hq:], v

    def _kept(self, heads: HeadSplit, positions: mx.array, count: int, dtype: mx.Dtype) -> RotaryTables | None:
        kept = self._tables
        if kept is not None and kept[1] is positions and kept[0] == (heads.rope_key, count, dtype):
            return kept[2]
        return None

    def tables(self, heads: HeadSplit, positions: mx.array, count: int, dtype: mx.Dtype) -> RotaryTables:
        tables = self._kept(heads, positions, count, dtype)
        if tables is None:
            key = (heads.rope_key, count, dtype)
            made = self._traced.get(key)
            if made is None:
                made = self._traced[key] = mx.compile(
                    lambda at: RotaryTables.at(heads.rope, at, count, heads.head_dim, dtype).arrays())
            tables = RotaryTables(*made(positions))
            self._tables = (key, positions, tables)
        return tables


CPU_OPS = CpuOps()
