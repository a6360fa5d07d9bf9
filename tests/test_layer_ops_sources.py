"""What can be checked of the CUDA layer-op kernels without a GPU: the q/k/v
kernel's store variants compile (nvcc, for sm_90, inside the translation unit
MLX builds) without spills, and which pools the kernel stores itself. Their
numerics run on a CUDA device in test_layer_ops.py."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from cuda_unit import compile_unit, nvcc, resources, translation_unit
from mlxcel.kernels import cuda_layer_ops
from mlxcel.kernels.cuda import float_bits
from mlxcel.kernels.cuda_layer_ops import CudaOps, pool_store, split_heads_call, store_inputs
from mlxcel.kernels.kv_quant import FORMATS, QuantizedPages
from mlxcel.kernels.layer_ops import COMPOSED, HeadSplit, PoolSlots

needs_nvcc = pytest.mark.skipif(nvcc() is None, reason="nvcc not installed: the CUDA sources cannot be compiled here")

CODE_DTYPES = {0: "bfloat16", 8: "int8", 4: "uint8"}


def store_unit(quant: int, head_dim: int, norm: bool, traditional: bool) -> str:
    """The store kernel of an 8B-shaped layer (32 q heads, 8 KV heads, bf16), its pool float or quantized."""
    dtypes = {"positions": "int32", "inv_freq": "float32", "slot_blocks": "int32", "slot_offsets": "int32"}
    def dtype(name: str) -> str:
        if name in dtypes:
            return dtypes[name]
        if name.endswith(("_pool", "_codes")):
            return CODE_DTYPES[quant]
        return "float16" if name.endswith(("_scales", "_zeros")) else "bfloat16"

    template = [("T", "bfloat16"), ("TW", "bfloat16"), ("D", head_dim), ("HQ", 32), ("HKV", 8), ("NORM", norm),
                ("TRADITIONAL", traditional), ("EPS_BITS", float_bits(1e-6)), ("SCALE_BITS", float_bits(1.0)),
                ("TP", CODE_DTYPES[quant]), ("BLOCK", 16)]
    return translation_unit("split_heads_store", cuda_layer_ops.LIBRARY, split_heads_call(quant),
                            [(name, dtype(name)) for name in store_inputs(quant)], [("q_out", "bfloat16")], template)


# Qwen3 heads (q/k norms, half-split rope) and Llama heads (no norms, neighbour pairs, which the kernel
# takes at D % 64 == 0); int8 at D=96 stores its three codes a lane byte by byte.
STORE_CASES = [(quant, d, norm, traditional) for quant, d in [(8, 64), (8, 128), (4, 64), (4, 128), (8, 96), (0, 128)]
               for norm, traditional in [(True, False), (False, True)] if not (traditional and d % 64)]


@needs_nvcc
@pytest.mark.parametrize("quant, head_dim, norm, traditional", STORE_CASES)
def test_store_kernel_compiles_without_spills(tmp_path, quant, head_dim, norm, traditional):
    # A decode step's grid is a few 4-warp blocks an SM (32 rows x 48 heads of an 8B model: 384 blocks
    # on 132 SMs); at <= 64 registers 8 of them fit an SM.
    registers, spills = resources(compile_unit(store_unit(quant, head_dim, norm, traditional), tmp_path))
    assert spills == 0 and registers <= 64


@needs_nvcc
def test_add_rms_norm_kernel_compiles_for_rows_of_any_leading_shape(tmp_path):
    # It reads its width from the last axis (residual_ndim), so [T, 1, hidden] goes in without a reshape.
    unit = translation_unit("add_rms_norm", cuda_layer_ops.LIBRARY, cuda_layer_ops.ADD_RMS_NORM_CALL,
                            [("residual", "bfloat16"), ("delta", "bfloat16"), ("weight", "bfloat16")],
                            [("out_sum", "bfloat16"), ("out_norm", "bfloat16")],
                            [("T", "bfloat16"), ("TW", "bfloat16"), ("THREADS", 256), ("PER", 16),
                             ("EPS_BITS", float_bits(1e-6))])
    assert "int residual_ndim" in unit
    _, spills = resources(compile_unit(unit, tmp_path))
    assert spills == 0


def test_pool_store_names_what_the_kernel_writes():
    pool = (16, 16, 2)
    assert pool_store(mx.zeros((*pool, 128), mx.bfloat16), 128) == 0
    assert pool_store(mx.zeros((*pool, 128), mx.float32), 128) == 0
    for d in (64, 96, 128, 256):
        assert pool_store(QuantizedPages.empty(FORMATS["int8"], *pool, d), d) == 8
    # int4: a lane packs whole bytes (D/32 even) and a 32-channel group spans whole lanes (D/32 divides 32).
    assert [pool_store(QuantizedPages.empty(FORMATS["int4"], *pool, d), d) for d in (32, 64, 96, 128, 192, 256)] \
        == [None, 4, None, 4, None, 4]


def test_an_int4_pool_the_kernel_cannot_store_is_left_to_the_caller():
    # D = 96: three channels a lane, a 32-channel group across lanes unevenly. The op declines before any
    # kernel is built (so this runs without CUDA) and hands k and v back for the pool's own write.
    rng = np.random.default_rng()
    d, rows = 96, 3
    heads = HeadSplit(8, 2, d, nn.RoPE(d, base=1e4), None, None)
    pages = QuantizedPages.empty(FORMATS["int4"], 4, 16, 2, d)
    slots = PoolSlots(pages, pages, mx.array([0, 1, 2], mx.int32), mx.array([3, 4, 5], mx.int32))
    qkv = mx.array(rng.normal(size=(rows, 1, 12 * d)), mx.float32)
    positions = mx.array([1, 70, 900], mx.int32)
    got = CudaOps(skinny_matmuls=False).split_heads(heads, qkv, positions, slots)
    assert got[1] is not None and got[2] is not None
    for part, want in zip(got, COMPOSED.split_heads(heads, qkv, positions)):
        np.testing.assert_array_equal(np.array(part), np.array(want))
