"""TMA tensor maps (CUDA's ``CUtensorMap``) of 16-bit weights, for producer_matmul's copy engine.

A map names a 2-D array's address, shape and row stride, and the box one
copy moves (64 k x ``box_rows`` rows, 128-byte swizzled). The driver encodes
it on the host (``cuTensorMapEncodeTiled``, through ctypes); the kernel reads
it from global memory, so it lives in a small MLX array of its own at a
64-byte boundary, made once a weight (weights do not move).
"""

from __future__ import annotations

import ctypes
import functools

import mlx.core as mx
import numpy as np

from . import managed

MAP_BYTES = 128
UINT16, INTERLEAVE_NONE, SWIZZLE_128B, L2_PROMOTION_256B, OOB_FILL_ZEROS = 1, 0, 3, 3, 0


@functools.lru_cache(maxsize=1)
def _encode():
    encode = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    u32, u64 = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64, u64, u32, u32,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return encode


def address(array: mx.array) -> int:
    """Where an array's data lives: MLX's CUDA buffers are managed memory, one address for host and GPU."""
    mx.eval(array)
    if array.dtype in (mx.bfloat16, mx.float16):
        array = array.view(mx.uint16)   # numpy has no bfloat16; the view shares the buffer
    return np.asarray(array).ctypes.data


def weight_map(weight: mx.array, box_rows: int) -> mx.array:
    """The tensor map of an evaluated row-major 16-bit weight [N, K] whose boxes are 64 k x ``box_rows``
    rows, in a uint8 array holding it at its first 64-byte boundary (the kernel's ``aligned_map``)."""
    n, k = weight.shape
    tensor_map = (ctypes.c_uint64 * (MAP_BYTES // 8))()
    result = _encode()(ctypes.byref(tensor_map), UINT16, 2, address(weight), (ctypes.c_uint64 * 2)(k, n),
                       (ctypes.c_uint64 * 1)(2 * k), (ctypes.c_uint32 * 2)(64, box_rows),
                       (ctypes.c_uint32 * 2)(1, 1), INTERLEAVE_NONE, SWIZZLE_128B, L2_PROMOTION_256B,
                       OOB_FILL_ZEROS)
    if result != 0:
        raise OSError(f"cuTensorMapEncodeTiled returned CUDA error {result}")
    holder = mx.array(np.zeros(MAP_BYTES + 64, np.uint8))
    at = address(holder)
    ctypes.memmove(at + (-at % 64), tensor_map, MAP_BYTES)
    managed.to_device(holder)
    return holder
