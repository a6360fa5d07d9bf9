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

__all__ = [
    "CsrBuilder", "HostCsr", "PagedCsrView", "PageStructure", "host_csr",
    "paged_attention_partial", "merge_states", "cascade_decline", "backend", "backend_name",
]

log = logging.getLogger(__name__)

KERNELS_ENV = "MLXCEL_KERNELS"

# GPU platform ("cuda" or "metal") -> module under mlxcel.kernels providing
# paged_attention_partial and merge_states with the portable signatures.
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
    # import_module costs ~5 us even for a loaded module: backend() runs
    # several times per layer of every decode step.
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


def cascade_decline(q: mx.array, k_pool: mx.array, shared_pages: int, members: int) -> str | None:
    """Why the dispatched kernels would lose on a cascade plan the planner
    chose (their break-even), or None. Backends without a cost model take
    every plan."""
    decline = getattr(backend(), "cascade_decline", None)
    return decline(q, k_pool, shared_pages, members) if decline else None


def merge_states(v_in: mx.array, lse_in: mx.array, o_indptr) -> tuple[mx.array, mx.array]:
    """Merge groups of contiguous softmax states (v [N, H, D], lse [N, H] log2,
    o_indptr [M+1]) into v [M, H, D], lse [M, H]."""
    return backend().merge_states(v_in, lse_in, o_indptr)
