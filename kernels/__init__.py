"""Paged attention kernels behind one API, dispatched to a backend.

The portable backend (MLX ops) runs everywhere. Fused backends register in
``FUSED_BACKENDS`` (device platform -> module) and are chosen automatically;
``OPT_IN_BACKENDS`` are chosen only by ``MLXCEL_KERNELS=fused``;
``MLXCEL_KERNELS=portable`` forces the portable kernels.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from types import ModuleType

import mlx.core as mx

from . import portable
from .csr import CsrBuilder, HostCsr, PagedCsrView, PageStructure, host_csr
from .shape import AttentionShape

__all__ = [
    "AttentionShape", "CsrBuilder", "HostCsr", "PagedCsrView", "PageStructure", "host_csr",
    "paged_attention_partial", "prepare_partial", "prepare_cascade", "merge_states", "prepare_merge",
    "cascade_decline", "fused_takes", "backend", "backend_name",
]

log = logging.getLogger(__name__)

KERNELS_ENV = "MLXCEL_KERNELS"

# GPU platform ("cuda" or "metal") -> module under mlxcel.kernels providing
# paged_attention_partial, prepare_partial, merge_states and prepare_merge
# with the portable signatures, and prepare_cascade, takes, cascade_decline.
FUSED_BACKENDS: dict[str, str] = {"cuda": "cuda"}

# Written but never run on their platform (no Apple GPU here): used only on
# explicit request until a run against the test-suite is recorded.
OPT_IN_BACKENDS: dict[str, str] = {"metal": "metal"}

_warned: set[str] = set()


def _gpu_platform() -> str | None:
    if mx.default_device().type != mx.DeviceType.gpu:
        return None
    if mx.metal.is_available():
        return "metal"
    return "cuda" if mx.cuda.is_available() else None


@functools.cache
def _module(name: str) -> ModuleType:
    # import_module costs ~5 us even for a loaded module.
    return importlib.import_module(f".{name}", __name__)


def _fused_backend(requested: bool) -> ModuleType | None:
    platform = _gpu_platform() or ""
    name = FUSED_BACKENDS.get(platform) or (OPT_IN_BACKENDS.get(platform) if requested else None)
    return _module(name) if name else None


def backend() -> ModuleType:
    """The backend for the default device: fused where registered for it,
    else portable; ``MLXCEL_KERNELS`` forces one (fused falls back, warned once)."""
    choice = os.environ.get(KERNELS_ENV, "").strip().lower()
    if choice == "portable":
        return portable
    fused = _fused_backend(choice == "fused")
    if fused is not None:
        return fused
    if choice and choice not in _warned:
        _warned.add(choice)
        reason = "no fused kernels for this device" if choice == "fused" else "unknown value"
        log.warning("%s=%r: %s, using the portable kernels", KERNELS_ENV, choice, reason)
    return portable


def backend_name() -> str:
    return backend().__name__.rsplit(".", 1)[-1]


def paged_attention_partial(q: mx.array, k_pool: mx.array, v_pool: mx.array, csr: PagedCsrView,
                            *, scale: float, chunk_pages: int | None = None) -> tuple[mx.array, mx.array]:
    """Attention of q [R, Hq, D] over each row's pages: (o [R, Hq, D] float32
    normalized, lse [R, Hq] float32 log2). Query head h reads KV head h // (Hq // Hkv).
    ``chunk_pages`` fixes the split-KV tile width (default: heuristic or MLXCEL_CHUNK_PAGES)."""
    return backend().paged_attention_partial(q, k_pool, v_pool, csr, scale=scale, chunk_pages=chunk_pages)


def prepare_partial(csr: PagedCsrView, shape: AttentionShape, chunk_pages: int | None = None):
    """paged_attention_partial over this layout with its host work (tiles,
    launch constants) done once: call the result with (q, k_pool, v_pool,
    last_page_len) for (o, lse)."""
    return backend().prepare_partial(csr, shape, chunk_pages)


def prepare_cascade(shape: AttentionShape, rows: int, shared: PagedCsrView, private: PagedCsrView, members):
    """A fused backend's whole cascade step over this layout (call it with
    (q, k_pool, v_pool, last_page_len) for o in q's dtype), or None where the
    backend has none for this shape and the levels are composed from partials."""
    module = backend()
    if not hasattr(module, "prepare_cascade") or not module.takes(shape):
        return None
    return module.prepare_cascade(shape, rows, shared, private, members)


def fused_takes(shape: AttentionShape) -> bool:
    """Whether a fused backend runs this shape's decode launches (each of its
    kernels reads q and the pool together)."""
    module = backend()
    return hasattr(module, "takes") and module.takes(shape)


def cascade_decline(shape: AttentionShape, shared_pages: int, members: int) -> str | None:
    """Why the dispatched kernels would lose on a cascade plan the planner
    chose (their break-even), or None. Backends without a cost model take
    every plan."""
    decline = getattr(backend(), "cascade_decline", None)
    return decline(shape, shared_pages, members) if decline else None


def merge_states(v_in: mx.array, lse_in: mx.array, o_indptr) -> tuple[mx.array, mx.array]:
    """Merge groups of contiguous softmax states (v [N, H, D], lse [N, H] log2,
    o_indptr [M+1]) into v [M, H, D], lse [M, H]."""
    return backend().merge_states(v_in, lse_in, o_indptr)


def prepare_merge(o_indptr, head_dim: int):
    """merge_states over these groups with their layout uploaded once: call
    the result with (v_in, lse_in)."""
    return backend().prepare_merge(o_indptr, head_dim)
