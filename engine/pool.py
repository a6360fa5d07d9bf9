"""The paged KV pool: per-layer K/V block arrays and a refcounted block allocator.

Every layer holds K and V as ``[num_blocks, block_size, Hkv, D]`` (float
pages, or int8/int4 codes with their scales: ``kernels.kv_quant``); a sequence's
KV cache is a list of block ids (its page table). A block id is live while
some page table holds it; its refcount is the number of page tables that do.
A block whose count drops to zero goes back to the free list, unless the
prefix cache wants it kept: then it waits in an LRU of reusable blocks until
either a returning prompt adopts it again or the allocator needs it back.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, Iterable

import mlx.core as mx

from mlxcel.kernels.kv_quant import FORMATS, KVQuant, Pages, QuantizedPages, store

DEFAULT_BLOCK_SIZE = 32
FLOAT_KV_DTYPES = ("float32", "float16", "bfloat16")
KV_DTYPES = (*FLOAT_KV_DTYPES, *FORMATS)


def dtype_name(dtype: mx.Dtype) -> str:
    """A float dtype as the CLI names it: "float32", "bfloat16"."""
    return str(dtype).removeprefix("mlx.core.")


class PoolExhausted(RuntimeError):
    """More blocks were asked for than the pool can hand out."""

    def __init__(self, requested: int, available: int) -> None:
        super().__init__(f"KV pool exhausted: {requested} blocks requested, {available} available")
        self.requested = requested
        self.available = available


@dataclass(frozen=True)
class PoolGeometry:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int = DEFAULT_BLOCK_SIZE
    dtype: mx.Dtype = mx.float32     # a float pool's element type
    quant: KVQuant | None = None     # quantized pages instead: codes and scales

    @classmethod
    def named(cls, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int,
              kv_dtype: str) -> "PoolGeometry":
        """A geometry whose pages are ``kv_dtype`` (one of KV_DTYPES); ValueError
        for another name or a head dim that format cannot store."""
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"unknown KV dtype {kv_dtype!r}: choose one of {', '.join(KV_DTYPES)}")
        if kv_dtype in FORMATS:
            reason = FORMATS[kv_dtype].unsupported(head_dim)
            if reason:
                raise ValueError(reason)
            return cls(num_layers, num_kv_heads, head_dim, block_size, quant=FORMATS[kv_dtype])
        return cls(num_layers, num_kv_heads, head_dim, block_size, getattr(mx, kv_dtype))

    @property
    def kv_dtype(self) -> str:
        """The pages' format as the CLI names it: "bfloat16", "int8", ..."""
        return self.quant.name if self.quant else dtype_name(self.dtype)

    @property
    def page_dtype(self) -> mx.Dtype:
        """The element type of a layer's page array (a quantized pool's codes):
        the kernels' ``AttentionShape.pool_dtype``."""
        return self.quant.code_dtype if self.quant else self.dtype

    @property
    def token_bytes(self) -> int:
        """Bytes of one token's K (or V) in one KV head and layer, scales included."""
        return self.quant.token_bytes(self.head_dim) if self.quant else self.head_dim * self.dtype.size

    @property
    def bytes_per_block(self) -> int:
        """K and V bytes of one block across all layers."""
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.token_bytes

    def blocks_for_bytes(self, budget: int) -> int:
        return budget // self.bytes_per_block


class BlockPool:
    def __init__(self, geometry: PoolGeometry, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a pool needs at least one block, got {num_blocks}")
        self.geometry = geometry
        self.num_blocks = num_blocks
        self.block_size = geometry.block_size
        shape = (num_blocks, geometry.block_size, geometry.num_kv_heads, geometry.head_dim)

        def layer() -> "mx.array | QuantizedPages":
            if geometry.quant:
                return QuantizedPages.empty(geometry.quant, *shape)
            return mx.zeros(shape, geometry.dtype)

        self.keys = [layer() for _ in range(geometry.num_layers)]
        self.values = [layer() for _ in range(geometry.num_layers)]
        mx.eval(self.keys, self.values)
        self.refcount = [0] * num_blocks
        self.free: deque[int] = deque(range(num_blocks))
        # Blocks at refcount 0 kept for the prefix cache, oldest release first.
        self.reusable: OrderedDict[int, None] = OrderedDict()
        # Set by the prefix cache: whether a released block is worth keeping,
        # and what to forget when the allocator takes a kept block back.
        self.keep_on_release: Callable[[int], bool] = lambda block: False
        self.on_reclaim: Callable[[int], None] = lambda block: None

    @classmethod
    def from_bytes(cls, geometry: PoolGeometry, budget: int) -> "BlockPool":
        return cls(geometry, geometry.blocks_for_bytes(budget))

    # -- allocator -------------------------------------------------------

    @property
    def num_available(self) -> int:
        """Blocks an allocation can get: free ones plus kept-but-unreferenced ones."""
        return len(self.free) + len(self.reusable)

    @property
    def num_live(self) -> int:
        return self.num_blocks - self.num_available

    @property
    def num_shared(self) -> int:
        return sum(1 for c in self.refcount if c > 1)

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks at refcount 1; raises PoolExhausted, changing nothing, if short."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        if n > self.num_available:
            raise PoolExhausted(n, self.num_available)
        blocks = []
        for _ in range(n):
            if self.free:
                block = self.free.popleft()
            else:
                block, _ = self.reusable.popitem(last=False)
                self.on_reclaim(block)
            self.refcount[block] = 1
            blocks.append(block)
        return blocks

    def incref(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            if self.refcount[block] == 0:
                if block not in self.reusable:
                    raise ValueError(f"block {block} is free; it cannot be shared")
                del self.reusable[block]
            self.refcount[block] += 1

    def decref(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            if self.refcount[block] <= 0:
                raise ValueError(f"block {block} released more often than it was held")
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                if self.keep_on_release(block):
                    self.reusable[block] = None
                else:
                    self.free.append(block)

    # -- storage ---------------------------------------------------------

    def slots(self, table: list[int], start: int, count: int) -> tuple[list[int], list[int]]:
        """(block ids, in-block offsets) for token positions start..start+count-1."""
        bs = self.block_size
        positions = range(start, start + count)
        return [table[p // bs] for p in positions], [p % bs for p in positions]

    def write(self, layer: int, blocks: mx.array, offsets: mx.array, keys: mx.array, values: mx.array) -> None:
        """Store new K/V ``[T, Hkv, D]`` at (block, offset) pairs (quantized
        once, here, in a quantized pool); in place once evaluated."""
        store(self.keys[layer], blocks, offsets, keys)
        store(self.values[layer], blocks, offsets, values)

    def replace(self, layer: int, keys: Pages, values: Pages) -> None:
        """The layer's arrays after stores made elsewhere (``store`` inside a traced layer)."""
        self.keys[layer], self.values[layer] = keys, values
