"""Host-written arrays moved onto the GPU before a kernel reads them.

MLX's CUDA backend keeps an array made from host data (``mx.array(numpy)``)
in managed memory, on the host's pages. The first kernel that reads such a
page faults and waits for the driver to migrate it: ~200 us for each of a
decode step's uploads on an H200 (the split kernel's median call takes 2.9
us, its call that reads the step's fresh positions 240; the private level's
11 us and 270), about 0.5 ms of a 6.8 ms step. A prefetch, issued when the
array is made, moves the pages on a copy stream of its own while the
previous step still runs, so the kernels find them in device memory.

The driver API through ctypes (MLX has no prefetch): if libcuda or its
calls are missing, or a prefetch fails, arrays stay as MLX made them (the
fault still moves them: slower, never wrong). The target is device 0, the
one MLX runs on unless a process sees several GPUs and picks another (then
the pages fault over from device 0: again slower, never wrong).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading

import mlx.core as mx
import numpy as np

log = logging.getLogger(__name__)

CU_STREAM_NON_BLOCKING = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class Prefetcher:
    """cuMemPrefetchAsync onto device 0 (MLX's GPU) on a non-blocking stream of the primary context (the
    runtime's, so MLX's), made current on each thread that prefetches."""

    def __init__(self, driver: ctypes.CDLL) -> None:
        self.driver = driver
        self.enabled = True
        self.context, self.stream, device = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
        self._check(driver.cuInit(0), "cuInit")
        self._check(driver.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        self._check(driver.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), device), "cuDevicePrimaryCtxRetain")
        self._threads: set[int] = set()
        self._current()
        self._check(driver.cuStreamCreate(ctypes.byref(self.stream), CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self.location = MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, device.value)
        self.prefetch = driver.cuMemPrefetchAsync_v2
        self.prefetch.argtypes = [ctypes.c_uint64, ctypes.c_size_t, MemLocation, ctypes.c_uint, ctypes.c_void_p]

    @staticmethod
    def _check(result: int, call: str) -> None:
        if result != 0:
            raise OSError(f"{call} returned CUDA error {result}")

    def _current(self) -> None:
        thread = threading.get_ident()
        if thread not in self._threads:
            self._check(self.driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
            self._threads.add(thread)

    def __call__(self, address: int, size: int) -> None:
        self._current()
        self._check(self.prefetch(address, size, self.location, 0, self.stream), "cuMemPrefetchAsync_v2")


@functools.lru_cache(maxsize=1)
def prefetcher() -> Prefetcher | None:
    if mx.default_device().type != mx.DeviceType.gpu or not mx.cuda.is_available():
        return None
    try:
        return Prefetcher(ctypes.CDLL("libcuda.so.1"))
    except (OSError, AttributeError) as error:
        log.info("no prefetch of host-written arrays (%s): the GPU's page faults move them", error)
        return None


def to_device(array: mx.array) -> mx.array:
    """``array`` (evaluated, made from host data), its pages moving to the GPU; unchanged off CUDA."""
    move = prefetcher()
    if move is not None and move.enabled and array.nbytes:
        try:
            move(np.asarray(array).ctypes.data, array.nbytes)
        except OSError as error:
            move.enabled = False
            log.info("prefetch failed (%s): the GPU's page faults move host-written arrays", error)
    return array
