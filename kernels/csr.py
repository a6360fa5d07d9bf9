"""Page tables of one step in CSR form, as every paged kernel reads them.

Row r attends to the tokens of pages ``indices[indptr[r]:indptr[r+1]]``: all of
each page but the first ``first_page_offset[r]`` tokens of its first page and
everything past ``last_page_len[r]`` in its last page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Hashable, Sequence

import mlx.core as mx
import numpy as np

from .managed import to_device


def upload(*arrays: np.ndarray) -> tuple[mx.array, ...]:
    """Host int32 arrays on the device in one transfer, each a view of one
    buffer. On a CUDA host a small array costs ~1-3 us to make with the GPU
    idle but 35-105 us at the 90th percentile while it runs (MLX's managed
    buffers, measured on an H200's host), and a decode step makes a dozen. On
    the CPU an array costs ~1 us and a view is one more op for every step's
    graph, so there each array is its own. The buffer's pages are prefetched
    to the GPU (``managed.to_device``): a kernel's first read of a host page
    would fault and stall it ~200 us."""
    parts = [np.asarray(a, np.int32) for a in arrays]
    if mx.default_device().type != mx.DeviceType.gpu:
        return tuple(mx.array(p) for p in parts)
    if len(parts) == 1:           # no views to make
        return (to_device(mx.array(parts[0])),)
    ends = np.cumsum([p.size for p in parts])
    buffer = to_device(mx.array(np.concatenate([p.reshape(-1) for p in parts]) if parts else np.zeros(0, np.int32)))
    views = (buffer[end - p.size:end] for p, end in zip(parts, ends.tolist()))
    return tuple(v if p.ndim == 1 else v.reshape(p.shape) for p, v in zip(parts, views))


@dataclass(frozen=True)
class HostCsr:
    """NumPy mirror of a view, for planners and references (no device sync)."""

    indptr: np.ndarray
    indices: np.ndarray
    last_page_len: np.ndarray
    first_page_offset: np.ndarray
    block_size: int

    @property
    def num_rows(self) -> int:
        return len(self.indptr) - 1

    def pages(self, row: int) -> np.ndarray:
        return self.indices[self.indptr[row] : self.indptr[row + 1]]

    def num_pages(self) -> np.ndarray:
        return np.diff(self.indptr)

    def num_tokens(self) -> np.ndarray:
        """Tokens each row attends to."""
        pages = self.num_pages()
        return np.where(
            pages > 0,
            (pages - 1) * self.block_size + self.last_page_len - self.first_page_offset,
            0,
        )


class PageStructure:
    """Identity of a view's page layout (indptr, indices, first_page_offset).

    Views built from unchanged page tables share one instance, so a decode
    plan, which depends only on the layout, is kept while it is the same.
    ``lineage`` is shared by layouts that only grew from one another (the same
    rows, each row's pages its old pages and more): a plan's spans hold across
    them, only the rows' private pages differ.
    """

    def __init__(self, grown_from: "PageStructure | None" = None) -> None:
        self.lineage = self if grown_from is None else grown_from.lineage


@dataclass(frozen=True, eq=False)
class PagedCsrView:
    indptr: mx.array
    indices: mx.array
    last_page_len: mx.array
    first_page_offset: mx.array
    block_size: int
    structure: PageStructure = field(default_factory=PageStructure, repr=False)
    _host: HostCsr | None = field(default=None, repr=False)

    @property
    def num_rows(self) -> int:
        return self.indptr.shape[0] - 1

    @cached_property
    def host(self) -> HostCsr:
        if self._host is not None:
            return self._host
        return HostCsr(
            np.array(self.indptr, dtype=np.int32),
            np.array(self.indices, dtype=np.int32),
            np.array(self.last_page_len, dtype=np.int32),
            np.array(self.first_page_offset, dtype=np.int32),
            self.block_size,
        )

    @classmethod
    def from_host(cls, host: HostCsr, structure: PageStructure | None = None,
                  device: tuple[mx.array, mx.array, mx.array] | None = None) -> "PagedCsrView":
        """Build a view from NumPy arrays; ``device`` reuses already-uploaded
        (indptr, indices, first_page_offset) arrays of an unchanged layout."""
        if device is None:
            indptr, indices, first, last = upload(host.indptr, host.indices, host.first_page_offset,
                                                  host.last_page_len)
        else:
            (indptr, indices, first), (last,) = device, upload(host.last_page_len)
        return cls(indptr, indices, last, first, host.block_size, structure or PageStructure(), host)


def host_csr(
    tables: Sequence[Sequence[int]],
    num_tokens: Sequence[int],
    block_size: int,
    first_page_offset: Sequence[int] | None = None,
) -> HostCsr:
    """CSR arrays for rows given as block tables and token counts.

    ``num_tokens[r]`` counts tokens from the start of the row's first page,
    including the ``first_page_offset[r]`` skipped ones.
    """
    rows = len(tables)
    offsets = np.zeros(rows, np.int32) if first_page_offset is None else np.asarray(first_page_offset, np.int32)
    counts = np.asarray(num_tokens, np.int64)
    if rows and (counts <= offsets).any():
        raise ValueError("every row must attend to at least one token")
    pages = (counts + block_size - 1) // block_size
    lengths = np.fromiter((len(t) for t in tables), np.int64, rows)
    if (lengths < pages).any():
        raise ValueError("a block table holds fewer pages than its token count needs")
    indptr = np.zeros(rows + 1, np.int32)
    np.cumsum(pages, out=indptr[1:])
    indices = (np.concatenate([np.asarray(t[:n], np.int32) for t, n in zip(tables, pages.tolist())]) if rows
               else np.zeros(0, np.int32))
    last = (counts - (pages - 1) * block_size).astype(np.int32)
    return HostCsr(indptr, indices, last, offsets, block_size)


def grew_from(old: HostCsr, new: HostCsr) -> bool:
    """Whether ``new`` has ``old``'s rows with each row's old pages first."""
    if old.num_rows != new.num_rows or not np.array_equal(old.first_page_offset, new.first_page_offset):
        return False
    old_pages = old.num_pages()
    if (new.num_pages() < old_pages).any():
        return False
    at = np.repeat(new.indptr[:-1] - old.indptr[:-1], old_pages) + np.arange(len(old.indices))
    return bool(np.array_equal(new.indices[at], old.indices))


class CsrBuilder:
    """Builds each step's view, re-uploading the page layout only when some
    row's block table changed (the key says so); last_page_len is rebuilt
    every step because it moves with every decoded token. A layout that only
    grew from the last one keeps its lineage (``PageStructure``). With
    ``row_keys`` (a key per row's table), a row's table is converted to NumPy
    once while its key holds (32 rows of 264 pages: ~0.2 ms a step else)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._key: Hashable = None
        self._structure: PageStructure | None = None
        self._device: tuple[mx.array, mx.array, mx.array] | None = None
        self._host: HostCsr | None = None
        self._rows: dict[Hashable, np.ndarray] = {}

    def build(self, key: Hashable, tables: Sequence[Sequence[int]], num_tokens: Sequence[int],
              first_page_offset: Sequence[int] | None = None,
              row_keys: Sequence[Hashable] | None = None) -> PagedCsrView:
        if key != self._key or self._host is None:
            if row_keys is not None:
                known = self._rows
                self._rows = {k: known[k] if k in known else np.asarray(t, np.int32)
                              for k, t in zip(row_keys, tables)}
                tables = [self._rows[k] for k in row_keys]
            host = host_csr(tables, num_tokens, self.block_size, first_page_offset)
            grown = self._host is not None and grew_from(self._host, host)
            self._structure = PageStructure(self._structure if grown else None)
            self._key, self._host, self._device = key, host, None
        else:
            counts = np.asarray(num_tokens, np.int64)
            pages = np.diff(self._host.indptr)
            if ((counts + self.block_size - 1) // self.block_size != pages).any():
                raise ValueError("token counts changed the page count under an unchanged key")
            last = (counts - (pages - 1) * self.block_size).astype(np.int32)
            host = HostCsr(self._host.indptr, self._host.indices, last,
                           self._host.first_page_offset, self.block_size)
        view = PagedCsrView.from_host(host, self._structure, self._device)
        self._device = (view.indptr, view.indices, view.first_page_offset)
        return view
