"""Random paged-attention inputs for the kernel and decode-path tests, drawn
from the `rng` fixture (conftest.py): fresh values every run."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel.engine.metrics import EngineMetrics
from mlxcel.kernels import PagedCsrView
from mlxcel.kernels.csr import HostCsr, host_csr
from mlxcel.kernels.kv_quant import FORMATS, Pages, QuantizedPages, quantize

# f32 kernels against the float64 reference: outputs are convex combinations of
# N(0, 1) values and scores are dot products of <= 128 terms, so float32
# rounding leaves errors around 1e-6; 2e-5 is a safe bound that a wrong mask,
# head mapping or merge (errors of order 0.1) cannot meet.
ATOL = 2e-5

# The fused GPU kernels feed the matrix units 16-bit operands: q and the
# softmax weights are rounded to the pool's dtype (relative 2^-9 for bf16,
# 2^-11 for f16) besides the pool values the reference reads too. Outputs up to
# ~3 then carry errors of a few 1e-3 (bf16) or ~1e-3 (f16); these bounds sit
# several times above that and below the O(0.1) errors of a wrong mask, head
# mapping or merge.
# Quantized pages (int8 codes, int4's uint8) are dequantized into float16 operands.
FUSED_ATOL = {mx.bfloat16: 3e-2, mx.float16: 1e-2, mx.int8: 1e-2, mx.uint8: 1e-2}


class OutcomeRecorder(EngineMetrics):
    """The engine's metrics, keeping the last outcome a standalone decode call reported."""

    last_outcome = None

    def record_decode(self, outcome, launches=1):
        super().record_decode(outcome, launches)
        self.last_outcome = outcome


def kernel_atol(pool_dtype) -> float:
    """Tolerance against the float64 reference for the kernels dispatched now:
    the portable ones compute in float32 whatever the pool dtype."""
    from mlxcel import kernels

    if kernels.backend_name() == "portable":
        return ATOL
    return FUSED_ATOL.get(pool_dtype, ATOL)


@dataclass
class PagedCase:
    host: HostCsr
    csr: PagedCsrView
    k_pool: Pages
    v_pool: Pages
    q: mx.array
    scale: float

    @property
    def num_kv_heads(self) -> int:
        return self.k_pool.shape[2]


def random_pools(rng: np.random.Generator, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype=mx.float32) -> tuple[Pages, Pages]:
    """Standard-normal K and V pools; ``dtype`` a float dtype or a quantized
    format's name ("int8", "int4": the normals quantized as the pool stores them)."""
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k, v = (mx.array(rng.standard_normal(shape).astype(np.float32)) for _ in range(2))
    if isinstance(dtype, str):
        return QuantizedPages(*quantize(k, FORMATS[dtype])), QuantizedPages(*quantize(v, FORMATS[dtype]))
    return k.astype(dtype), v.astype(dtype)


def random_query(rng: np.random.Generator, rows: int, heads: int, head_dim: int, dtype=mx.float32,
                 length: int | None = None) -> mx.array:
    shape = (rows, heads, head_dim) if length is None else (rows, heads, length, head_dim)
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def make_case(rng: np.random.Generator, tables: list[list[int]], num_tokens: list[int], *, block_size: int,
              kv_heads: int = 2, group: int = 4, head_dim: int = 64, first_page_offset: list[int] | None = None,
              dtype=mx.float32, q_dtype=mx.float32, num_blocks: int | None = None) -> PagedCase:
    host = host_csr(tables, num_tokens, block_size, first_page_offset)
    blocks = num_blocks or max(max(t) for t in tables if t) + 1
    k_pool, v_pool = random_pools(rng, blocks, block_size, kv_heads, head_dim, dtype)
    q = random_query(rng, len(tables), kv_heads * group, head_dim, q_dtype)
    return PagedCase(host, PagedCsrView.from_host(host), k_pool, v_pool, q, head_dim ** -0.5)


def fresh_blocks(rng: np.random.Generator, count: int, start: int = 0) -> list[int]:
    """``count`` distinct block ids from start.., in random order."""
    return [int(b) for b in start + rng.permutation(count)]


def mixed_batch(rng: np.random.Generator, *, block_size: int, shared_pages: int = 5, kv_heads: int = 2,
                group: int = 4, head_dim: int = 64, dtype=mx.float32, q_dtype=mx.float32) -> PagedCase:
    """Six rows: three members sharing ``shared_pages`` pages with partial last
    pages, a row sharing only the first two of them, a row entering the shared
    first page mid-page (dropped by the planner), and an unrelated row."""
    ids = iter(fresh_blocks(rng, 64))
    shared = [next(ids) for _ in range(shared_pages)]
    bs = block_size

    def tail(n: int) -> list[int]:
        return [next(ids) for _ in range(n)]

    tables = [shared + tail(2), shared + tail(1), shared + tail(3), shared[:2] + tail(2), shared + tail(1), tail(3)]
    tokens = [(shared_pages + 1) * bs + int(rng.integers(1, bs + 1)),
              shared_pages * bs + int(rng.integers(1, bs + 1)),
              (shared_pages + 2) * bs + int(rng.integers(1, bs + 1)),
              3 * bs + int(rng.integers(1, bs + 1)),
              shared_pages * bs + int(rng.integers(1, bs + 1)),
              2 * bs + int(rng.integers(1, bs + 1))]
    offsets = [0, 0, 0, 0, int(rng.integers(1, bs)), int(rng.integers(1, bs))]
    return make_case(rng, tables, tokens, block_size=bs, kv_heads=kv_heads, group=group, head_dim=head_dim,
                     first_page_offset=offsets, dtype=dtype, q_dtype=q_dtype, num_blocks=64)


def tree_tables(rng: np.random.Generator, tree, prefix=(), ids=None) -> list[list[int]]:
    """Block tables of a sharing tree: ``tree`` is (pages, [subtrees]), pages
    every row below shares, or an int, a leaf row with that many own pages."""
    ids = ids if ids is not None else iter(int(b) for b in rng.permutation(100_000))
    if isinstance(tree, int):
        return [list(prefix) + [next(ids) for _ in range(tree)]]
    pages, below = tree
    own = list(prefix) + [next(ids) for _ in range(pages)]
    return [t for sub in below for t in tree_tables(rng, sub, own, ids)]


def forest_batch(rng: np.random.Generator, trees, *, block_size: int, kv_heads: int = 2, group: int = 4,
                 head_dim: int = 64, dtype=mx.float32, q_dtype=mx.float32) -> tuple[PagedCase, np.ndarray]:
    """The rows of several sharing trees (one group each), plus a row entering
    the first tree's first page mid-page and a one-page row on that page,
    in random order, partial last pages: (case, order) with order[new] = old row."""
    ids = iter(int(b) for b in rng.permutation(4096))
    tables = [t for tree in trees for t in tree_tables(rng, tree, (), ids)]
    first = tables[0][0]
    tables += [[first, next(ids), next(ids)], [first]]
    tokens = [(len(t) - 1) * block_size + int(rng.integers(1, block_size + 1)) for t in tables]
    offsets = [0] * (len(tables) - 2) + [int(rng.integers(1, block_size)), 0]
    tokens[-1] = int(rng.integers(1, block_size + 1))
    order = rng.permutation(len(tables))
    pick = lambda values: [values[i] for i in order]          # noqa: E731
    case = make_case(rng, pick(tables), pick(tokens), block_size=block_size, kv_heads=kv_heads, group=group,
                     head_dim=head_dim, first_page_offset=pick(offsets), dtype=dtype, q_dtype=q_dtype,
                     num_blocks=4096)
    return case, order


# Sharing trees (see paged_cases.tree_tables), the groups and depth their plan has.
FORESTS = {
    "two groups": ([(6, [2, 1, 3]), (4, [1, 2])], 2, 1),
    "three groups": ([(5, [1, 2]), (3, [2, 1, 1]), (4, [1, 1])], 3, 1),
    "two deep": ([(6, [(3, [1, 2]), 1, 2])], 1, 2),
    "three deep beside a group": ([(4, [(3, [(2, [1, 2]), 1]), 2]), (3, [1, 1])], 2, 3),
    # The two rows' one-page node is below min_shared_pages: its page goes to
    # the pair below it, whose span starts where the outer one ended.
    "a nested node below the thresholds": ([(4, [(1, [(3, [1, 2]), 1]), 2])], 1, 2),
}
