"""Quantized KV pages: what a pool of int8 or int4 pages holds, how a token's
keys and values are quantized once when written, and how the kernels read
them back.

- int8: symmetric, one scale per token and KV head (max |x| / 127); a key or
  value is ``code * scale``.
- int4: affine in groups of 32 channels of one token and KV head (min and
  (max - min) / 15 per group), two codes a byte, the even channel in the low
  nibble; a key or value is ``code * scale + zero``. KIVI groups keys per
  channel along the tokens instead (key outliers sit in channels), but here a
  page fills one token a decode step and a token is quantized once, when it
  is written: a per-channel group would have to stay in full precision until
  its page fills (KIVI's residual), a second page format in every kernel and
  in the prefix cache. Per-token groups of 32 channels keep an outlier
  channel's harm inside its own group.

Scales and zeros are float16 (11 significant bits, below either format's step;
bfloat16's 8 would round an int8 scale by up to 0.4%, as much as the code's own
step). The quantizer here is MLX ops; ``cuda_layer_ops`` quantizes the same way
in the kernel that stores a decode step's K/V into the pool.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple, Union

import mlx.core as mx

SCALE_DTYPE = mx.float16


@dataclass(frozen=True)
class KVQuant:
    """One quantized page format."""

    name: str
    bits: int
    group: int | None        # channels sharing a scale; None: the whole head
    code_dtype: mx.Dtype

    @property
    def levels(self) -> int:
        """The largest code magnitude: 127 (int8, symmetric) or 15 (int4, unsigned)."""
        return 127 if self.group is None else (1 << self.bits) - 1

    @property
    def affine(self) -> bool:
        return self.group is not None

    def code_width(self, head_dim: int) -> int:
        """Code elements (bytes) per token and KV head."""
        return head_dim * self.bits // 8

    def groups(self, head_dim: int) -> int:
        return 1 if self.group is None else head_dim // self.group

    def token_bytes(self, head_dim: int) -> int:
        """Bytes of one token's K (or V) in one KV head: codes, scales, zeros."""
        return self.code_width(head_dim) + self.groups(head_dim) * SCALE_DTYPE.size * (2 if self.affine else 1)

    def unsupported(self, head_dim: int) -> str | None:
        """Why pages of this head dim cannot be stored in this format, or None."""
        step = self.group or 2
        if head_dim % step:
            return f"{self.name} KV pages need a head dim divisible by {step}, the model has {head_dim}"
        return None


INT8 = KVQuant("int8", 8, None, mx.int8)
INT4 = KVQuant("int4", 4, 32, mx.uint8)
FORMATS = {f.name: f for f in (INT8, INT4)}
BY_CODE_DTYPE = {f.code_dtype: f for f in (INT8, INT4)}


class QuantizedPages(NamedTuple):
    """One layer's quantized keys (or values): a tuple of arrays, so MLX's
    tree functions (``mx.eval``, ``mx.async_eval``) see every part.

    codes  [blocks, block_size, Hkv, code_width]  int8 or uint8 (int4, packed)
    scales [blocks, block_size, Hkv, groups]      float16
    zeros  [blocks, block_size, Hkv, groups]      float16 (int4), else None
    """

    codes: mx.array
    scales: mx.array
    zeros: mx.array | None

    @classmethod
    def empty(cls, fmt: KVQuant, blocks: int, block_size: int, kv_heads: int, head_dim: int) -> "QuantizedPages":
        lead = (blocks, block_size, kv_heads)
        scales = (*lead, fmt.groups(head_dim))
        return cls(mx.zeros((*lead, fmt.code_width(head_dim)), fmt.code_dtype), mx.zeros(scales, SCALE_DTYPE),
                   mx.zeros(scales, SCALE_DTYPE) if fmt.affine else None)

    @property
    def format(self) -> KVQuant:
        return BY_CODE_DTYPE[self.codes.dtype]

    @property
    def dtype(self) -> mx.Dtype:
        """The codes' dtype: what ``AttentionShape.pool_dtype`` names a format by."""
        return self.codes.dtype

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The pages' logical shape [blocks, block_size, Hkv, D], as a float pool's."""
        blocks, block_size, heads, width = self.codes.shape
        return blocks, block_size, heads, width * 8 // self.format.bits

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self if a is not None)

    def write(self, blocks: mx.array, offsets: mx.array, x: mx.array) -> None:
        """Quantize x [T, Hkv, D] into the slots (block, offset); in place once evaluated."""
        codes, scales, zeros = quantize(x, self.format)
        self.codes[blocks, offsets] = codes
        self.scales[blocks, offsets] = scales
        if zeros is not None:
            self.zeros[blocks, offsets] = zeros

    def gather(self, at: "PageGather") -> "QuantizedPages":
        """Every part at ``at``'s pages, in ``gather_heads``' layout."""
        return QuantizedPages(*(None if part is None else gather_heads(part, at) for part in self))


# A layer's keys (or values) as the kernels take them.
Pages = Union[mx.array, QuantizedPages]


def store(pages: Pages, blocks: mx.array, offsets: mx.array, x: mx.array) -> None:
    """x [T, Hkv, D] into the pages' slots (block, offset), in place once evaluated: quantized once, here, in
    quantized pages; cast to a float pool's dtype. ``pages``' arrays become the stores' outputs."""
    if isinstance(pages, QuantizedPages):
        pages.write(blocks, offsets, x)
    else:
        pages[blocks, offsets] = x.astype(pages.dtype)


def quantize(x: mx.array, fmt: KVQuant) -> tuple[mx.array, mx.array, mx.array | None]:
    """(codes, scales, zeros) of x [..., D] (any float dtype), computed in float32.
    The stored (float16) scale and zero are the ones the codes are computed
    against, so dequantizing reads back the nearest code's value."""
    x = x.astype(mx.float32)
    d = x.shape[-1]
    if not fmt.affine:
        scale = (mx.abs(x).max(axis=-1, keepdims=True) / fmt.levels).astype(SCALE_DTYPE)
        step = scale.astype(mx.float32)
        codes = mx.round(x / mx.where(step > 0, step, 1.0))
        return mx.clip(codes, -fmt.levels, fmt.levels).astype(fmt.code_dtype), scale, None
    grouped = x.reshape(*x.shape[:-1], d // fmt.group, fmt.group)
    low = grouped.min(axis=-1, keepdims=True).astype(SCALE_DTYPE)
    scale = ((grouped.max(axis=-1, keepdims=True) - low.astype(mx.float32)) / fmt.levels).astype(SCALE_DTYPE)
    step = scale.astype(mx.float32)
    codes = mx.round((grouped - low.astype(mx.float32)) / mx.where(step > 0, step, 1.0))
    codes = mx.clip(codes, 0, fmt.levels).astype(mx.uint8).reshape(*x.shape[:-1], d // 2, 2)
    packed = codes[..., 0] | (codes[..., 1] << 4)
    return packed, scale[..., 0], low[..., 0]


def unpack_int4(codes: mx.array) -> mx.array:
    """uint8 [..., D/2] -> uint8 [..., D], the low nibble first."""
    return mx.stack([codes & 15, codes >> 4], axis=-1).reshape(*codes.shape[:-1], codes.shape[-1] * 2)


def dequantize(pages: QuantizedPages, dtype: mx.Dtype = mx.float32) -> mx.array:
    """The keys (or values) [..., D] the pages hold, computed in float32."""
    fmt = pages.format
    if not fmt.affine:
        x = pages.codes.astype(mx.float32) * pages.scales.astype(mx.float32)
        return x.astype(dtype)
    codes = unpack_int4(pages.codes).astype(mx.float32)
    lead, d = codes.shape[:-1], codes.shape[-1]
    grouped = codes.reshape(*lead, d // fmt.group, fmt.group)
    x = grouped * pages.scales.astype(mx.float32)[..., None] + pages.zeros.astype(mx.float32)[..., None]
    return x.reshape(*lead, d).astype(dtype)


@functools.cache
def head_index(heads: int) -> mx.array:
    """[1, heads, 1] head ids, made once (gathers of every layer index with it)."""
    index = mx.arange(heads, dtype=mx.int32)[None, :, None]
    mx.eval(index)
    return index


class PageGather(NamedTuple):
    """Where a read of the pool gathers: block ids ``pages`` [S, 1, P] and, for
    pool parts of [blocks, block_size, Hkv, W], the row of each page's token
    and head in the part seen as [blocks * block_size * Hkv, W] (``rows``
    [S, Hkv, P * block_size]): one take of those rows is ``gather_heads``'
    layout. Made once for a layout, read by every layer's gathers."""

    pages: mx.array
    rows: mx.array

    @classmethod
    def of(cls, pages: mx.array, block_size: int, kv_heads: int) -> "PageGather":
        tokens = pages[..., None] * block_size + mx.arange(block_size, dtype=mx.int32)   # [S, 1, P, block_size]
        rows = tokens * kv_heads + head_index(kv_heads)[..., None]
        return cls(pages, rows.reshape(pages.shape[0], kv_heads, -1))

    def after(self, writer: mx.array) -> "PageGather":
        """The same gather run only once ``writer`` is computed: the output of a kernel that wrote the pool
        in place. MLX orders a GPU's kernels only through the buffers they read and write, so the indices
        pass through a kernel that reads one element of ``writer`` (adding its bits & 0)."""
        bits = writer.reshape(-1)[:1]
        zero = (bits.view(mx.int16 if bits.itemsize == 2 else mx.int32) & 0).astype(mx.int32)
        return PageGather(self.pages + zero, self.rows + zero)


def gather_heads(part: mx.array, at: PageGather) -> mx.array:
    """One pool array [blocks, block_size, Hkv, W] at ``at``'s pages as
    [S, Hkv, P * block_size, W]: each head's tokens contiguous. A take of rows
    is two graph nodes where NumPy-style indexing builds twelve. Rows of a
    few elements (scales) are gathered a page at a time and then transposed:
    MLX's gather pays per slice, and a slice per token and head of one scale
    cost as much as the codes' (measured 4x slower on the CPU)."""
    blocks, block_size, hkv, width = part.shape
    if width >= 16:
        return mx.take(part.reshape(-1, width), at.rows, axis=0)
    by_page = part.reshape(blocks, -1)[at.pages[:, 0]]                  # [S, P, block_size * Hkv * W]
    by_page = by_page.reshape(*by_page.shape[:2], block_size, hkv, width)
    return by_page.transpose(0, 3, 1, 2, 4).reshape(by_page.shape[0], hkv, -1, width)


def read_scaled(pool: Pages, at: PageGather) -> tuple[mx.array, mx.array | None]:
    """The pool at ``at`` (gather_heads' layout) in float32 as (x, per-token
    scale or None): int8 pages give their codes and each token's scale [..., 1]
    for the caller to apply to what it computes from them (scores, softmax
    weights: a factor over the tokens instead of over every channel); other
    pages give their values."""
    if isinstance(pool, QuantizedPages) and not pool.format.affine:
        return gather_heads(pool.codes, at).astype(mx.float32), gather_heads(pool.scales, at).astype(mx.float32)
    return read_pages(pool, at, mx.float32), None


def read_pages(pool: Pages, at: PageGather, dtype: mx.Dtype) -> mx.array:
    """The pool at ``at`` (gather_heads' layout) as ``dtype``: a float pool's
    elements, a quantized pool's codes dequantized (in float32)."""
    if isinstance(pool, QuantizedPages):
        return dequantize(pool.gather(at), dtype)
    return gather_heads(pool, at).astype(dtype)
