"""The skinny matmul (mlxcel.kernels.cuda_matmul): which projections it takes, what the ops fall back to,
that its sources compile as MLX builds them (nvcc, no GPU needed), and, on a CUDA device, its products
and epilogues (the norm on the way in, the residual add, swiglu) against float64 on fresh random inputs,
each on both kernels (the ``kernel`` fixture: skinny_matmul's launches, or producer_matmul's).

Tolerance: bf16/f16 products are exact in float32; the float32 sums over K terms are off by at most
K 2^-24 sum |x_k w_k| (the warps' order included), and each rounding to the output's dtype adds at most
u of its result (the unit roundoff: 2^-8 for bfloat16's 8 significant bits, 2^-11 for float16's 11). With
the norm, each operand x_k g_k is rounded once (u |x_k g_k w_k| summed, times the row's 1/rms); an added
residual or each of swiglu's rounded steps adds u of its result. Where a bound adds roundings, a quarter
more covers their second-order terms.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from cuda_unit import compile_unit, nvcc, resources, translation_unit
from mlxcel.engine.model import Linear, project
from mlxcel.kernels import cuda_matmul
from mlxcel.kernels.cuda_layer_ops import CUDA_OPS, CUDA_SKINNY_OPS, cuda_ops
from mlxcel.kernels.cuda_matmul import (LIBRARY, MAX_ROWS, PRODUCT, SHARED_LIMIT, SMS, Epilogue, Tiles,
                                        instance_rows, producer_tiles, skinny_matmul, takes, takes_norm, tiles_for)
from mlxcel.kernels.layer_ops import COMPOSED

needs_cuda = pytest.mark.skipif(not mx.cuda.is_available(),
                                reason="the skinny matmul needs a CUDA device (CI has none; "
                                       "benchmarks/gpu_suite.sh runs these on the GPU)")
needs_nvcc = pytest.mark.skipif(nvcc() is None, reason="nvcc not installed: the CUDA sources cannot be compiled here")
ROUNDING = {mx.bfloat16: 2.0**-8, mx.float16: 2.0**-11}   # unit roundoff


@pytest.fixture(params=["mma", "producer"])
def kernel(request, monkeypatch):
    """The launches tiles_for picks: skinny_matmul's, or (PRODUCER) producer_matmul's."""
    monkeypatch.setattr(cuda_matmul, "PRODUCER", request.param == "producer")
    return request.param


@pytest.mark.parametrize("x_shape, w_shape, dtype, w_dtype, taken", [
    ((32, 1, 4096), (6144, 4096), mx.bfloat16, mx.bfloat16, True),
    ((MAX_ROWS, 4096), (4096, 4096), mx.float16, mx.float16, True),
    ((MAX_ROWS + 1, 1, 4096), (4096, 4096), mx.bfloat16, mx.bfloat16, False),   # a prefill chunk: cuBLAS
    ((8, 1, 4096), (4096, 4096), mx.float32, mx.float32, False),
    ((8, 1, 4096), (4096, 4096), mx.bfloat16, mx.float16, False),
    ((8, 1, 4064), (4096, 4064), mx.bfloat16, mx.bfloat16, False),                # K not whole chunks
    ((8, 1, 4096), (4100, 4096), mx.bfloat16, mx.bfloat16, False),                # N not whole 8-column tiles
    ((0, 1, 4096), (4096, 4096), mx.bfloat16, mx.bfloat16, False),                # no rows
])
def test_takes_16_bit_weights_over_a_decode_steps_rows(x_shape, w_shape, dtype, w_dtype, taken):
    x, w = mx.zeros(x_shape, dtype=dtype), mx.zeros(w_shape, dtype=w_dtype)
    assert takes(x, w) is taken


def test_only_the_engines_own_linear_reaches_the_kernel():
    # Biased, quantized and tensor-parallel layers (a shard's call includes its collective) run as they are,
    # whatever the step's ops: no launch, so this runs on the CPU too.
    x = mx.random.normal((4, 1, 64)).astype(mx.bfloat16)
    biased = nn.Linear(64, 32, bias=True)
    biased.set_dtype(mx.bfloat16)
    quantized = nn.QuantizedLinear.from_linear(nn.Linear(64, 32), group_size=32, bits=4)

    class Shard(nn.Module):      # a 16-bit weight, no bias, and a call that is more than the product
        def __init__(self) -> None:
            super().__init__()
            self.weight = mx.random.normal((32, 64)).astype(mx.bfloat16)

        def __call__(self, x: mx.array) -> mx.array:
            return x @ self.weight.T + 1

    for layer in (biased, quantized, Shard()):
        np.testing.assert_array_equal(np.array(project(CUDA_SKINNY_OPS, layer, x).astype(mx.float32)),
                                      np.array(layer(x).astype(mx.float32)))
    plain = nn.Linear(64, 32, bias=False)
    linear = Linear(plain)
    linear.prepare()
    np.testing.assert_array_equal(np.array(project(COMPOSED, linear, x.astype(mx.float32))),
                                  np.array(plain(x.astype(mx.float32))))
    assert COMPOSED.host_bound() is COMPOSED
    assert CUDA_OPS.skinny_matmuls is False and CUDA_SKINNY_OPS.skinny_matmuls is True


@pytest.mark.parametrize("value, every_step, host_bound, tma", [("", False, True, True), ("cublas", False, False, True),
                                                                 ("skinny", True, True, True),
                                                                 ("no-tma", False, True, False)])
def test_host_bound_steps_take_the_skinny_kernel_unless_the_env_says_cublas(value, every_step, host_bound, tma):
    ops = cuda_ops(value)
    assert ops.skinny_matmuls is every_step
    assert ops.host_bound().skinny_matmuls is host_bound and ops.host_bound().tma is tma


@pytest.mark.parametrize("max_rows, rows", [(1, [16]), (16, [16]), (17, [16, 32]), (64, [16, 32, 48, 64]),
                                            (256, [16, 32, 48, 64])])
def test_instance_rows_name_one_row_count_for_each_kernel_instance(max_rows, rows):
    # The kernel's instances differ by 16-row tiles (tiles_for): one row count each, up to MAX_ROWS (cuBLAS after).
    assert instance_rows(max_rows) == rows
    assert [tiles_for(r, 4096).m_tiles for r in rows] == list(range(1, len(rows) + 1))
    assert CUDA_SKINNY_OPS.instance_rows(max_rows) == rows and CUDA_OPS.host_bound().instance_rows(max_rows) == rows
    assert CUDA_OPS.instance_rows(max_rows) == [] and COMPOSED.instance_rows(max_rows) == []


def test_takes_a_norm_weight_of_one_value_per_channel_in_xs_dtype():
    x = mx.zeros((8, 1, 256), dtype=mx.bfloat16)
    assert takes_norm(x, mx.ones((256,), dtype=mx.bfloat16))
    assert not takes_norm(x, mx.ones((256,), dtype=mx.float32))
    assert not takes_norm(x, mx.ones((128,), dtype=mx.bfloat16))


def test_ops_that_do_not_fold_run_the_composed_definitions():
    # cuBLAS's ops never fold; the skinny ops decline what the kernel does not take (float32 here): no
    # launch either way, so this runs on the CPU.
    rng = np.random.default_rng()
    x = mx.array(rng.standard_normal((4, 1, 64)).astype(np.float32))
    w = mx.array(rng.standard_normal((32, 64)).astype(np.float32))
    g, residual = mx.array(rng.standard_normal(64).astype(np.float32)), mx.array(rng.standard_normal((4, 1, 32)))
    assert not CUDA_OPS.folds(x.astype(mx.bfloat16), w.astype(mx.bfloat16))
    assert not CUDA_SKINNY_OPS.folds(x, w)
    normed = mx.fast.rms_norm(x, g, 1e-6) @ w.T
    np.testing.assert_array_equal(np.array(CUDA_SKINNY_OPS.normed_matmul(x, g, 1e-6, w, w.T)), np.array(normed))
    np.testing.assert_array_equal(np.array(CUDA_SKINNY_OPS.matmul_add(x, w, w.T, residual)),
                                  np.array(residual + x @ w.T))
    gate, up = mx.split(normed, 2, axis=-1)
    np.testing.assert_array_equal(np.array(CUDA_SKINNY_OPS.normed_swiglu(x, g, 1e-6, w, w.T)),
                                  np.array(nn.silu(gate) * up))


EPILOGUES = [PRODUCT, Epilogue(norm=True), Epilogue(add=True), Epilogue(norm=True, swiglu=True)]


@needs_nvcc
@pytest.mark.parametrize("rows", [1, 16, 32, 48, MAX_ROWS])
@pytest.mark.parametrize("n", [4096, 6144, 24576])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("epilogue", EPILOGUES, ids=str)
def test_the_kernel_compiles_without_spills_in_its_shared_memory(rows, n, dtype, epilogue):
    tiles = tiles_for(rows, n, epilogue)
    assert tiles.shared_bytes(epilogue) <= SHARED_LIMIT
    unit = translation_unit("skinny_matmul", LIBRARY, epilogue.call(), [(name, dtype) for name in epilogue.inputs()],
                            [("y", dtype)],
                            [("T", dtype), ("M_TILES", tiles.m_tiles), ("N_TILES", tiles.n_tiles),
                             ("WARPS", tiles.warps), ("STAGES", tiles.stages), ("EPS_BITS", 0),
                             ("LOOP", tiles.loop)])
    with tempfile.TemporaryDirectory() as folder:
        registers, spills = resources(compile_unit(unit, Path(folder)))
    assert spills == 0 and registers <= 255


# The engine's four launches (q/k/v with the norm, o and down adding the residual, gate/up with the norm and
# swiglu), and the plain product at gate/up's width (producer_tiles' widest block).
ENGINE_LAUNCHES = {"qkv": (6144, Epilogue(norm=True)), "o_down": (4096, Epilogue(add=True)),
                   "gate_up": (24576, Epilogue(norm=True, swiglu=True)), "product": (24576, PRODUCT)}


@needs_nvcc
@pytest.mark.parametrize("rows", [1, 32, MAX_ROWS])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("launch", ENGINE_LAUNCHES)
def test_the_producer_kernel_compiles_without_spills_in_its_shared_memory(rows, dtype, launch):
    n, epilogue = ENGINE_LAUNCHES[launch]
    tiles = producer_tiles(rows, n, epilogue)
    assert tiles.producer and tiles.shared_bytes(epilogue) <= SHARED_LIMIT
    unit = translation_unit("skinny_matmul", LIBRARY, epilogue.call(producer=True),
                            [(name, "uint8" if name == "w_map" else dtype) for name in epilogue.inputs(producer=True)],
                            [("y", dtype)],
                            [("T", dtype), ("M_TILES", tiles.m_tiles), ("N_TILES", tiles.n_tiles),
                             ("WARPS", tiles.warps), ("STAGES", tiles.stages), ("EPS_BITS", 0)])
    with tempfile.TemporaryDirectory() as folder:
        registers, spills = resources(compile_unit(unit, Path(folder)))
    assert spills == 0 and registers <= 255


@pytest.mark.parametrize("rows", [1, 32, MAX_ROWS])
@pytest.mark.parametrize("launch", ENGINE_LAUNCHES)
def test_producer_launches_cover_the_sms_in_one_wave(rows, launch):
    # One block an SM, each taking the same number of column tiles but the last, its ring deep enough to
    # keep 40 KB or more of weight rows in flight and each stage read by one consumer warp.
    n, epilogue = ENGINE_LAUNCHES[launch]
    tiles = producer_tiles(rows, n, epilogue)
    blocks, column_tiles = tiles.blocks(n), tiles.column_tiles(n)
    each = -(-column_tiles // blocks)
    assert blocks <= SMS and (blocks - 1) * each < column_tiles <= blocks * each
    assert tiles.shared_bytes(epilogue) <= SHARED_LIMIT and (tiles.stages - 1) * tiles.n_tiles * 8 * 128 >= 40 << 10
    assert tiles.stages % tiles.warps == 0


def as64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32), dtype=np.float64)


@needs_cuda
@pytest.mark.parametrize("rows, n, k", [(32, 6144, 4096), (1, 4096, 4096), (5, 24, 64), (20, 200, 192),
                                        (MAX_ROWS, 1024, 12288), (17, 64, 4160), (7, 136, 640)])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bfloat16", "float16"])
def test_products_match_float64(rows, n, k, dtype, kernel):
    # Rows past a 16-row tile, N past a 64-column block, K of fewer chunks than warps, K not a multiple of
    # the warps' chunks: each a path of the kernel's guards (producer_matmul's: rows and columns past the
    # end zero-filled, fewer chunks than its ring's stages, a ring wrapping part-way through K).
    rng = np.random.default_rng()
    x = mx.array(rng.standard_normal((rows, 1, k)).astype(np.float32)).astype(dtype)
    w = mx.array((rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32)).astype(dtype)
    assert takes(x, w)
    got = as64(skinny_matmul(x, w))[:, 0]
    x64, w64 = as64(x)[:, 0], as64(w)
    want = x64 @ w64.T
    bound = ROUNDING[dtype] * np.abs(want) + k * 2.0**-24 * (np.abs(x64) @ np.abs(w64).T)
    assert np.all(np.abs(got - want) <= bound), np.abs(got - want).max()
    # The bound is tight enough to catch a misplaced operand: a permuted k order is far outside it.
    wrong = x64[:, ::-1] @ w64.T
    assert np.mean(np.abs(wrong - want) > bound) > 0.5


@needs_cuda
def test_every_launch_shape_of_the_sweep_computes_the_same_product():
    rng = np.random.default_rng()
    x = mx.array(rng.standard_normal((32, 1, 1024)).astype(np.float32)).astype(mx.bfloat16)
    w = mx.array((rng.standard_normal((512, 1024)) / 32).astype(np.float32)).astype(mx.bfloat16)
    want = as64(skinny_matmul(x, w))
    for tiles in (Tiles(2, 4, 2, 4), Tiles(2, 8, 2, 6), Tiles(2, 4, 4, 6), Tiles(2, 6, 4, 3)):
        assert tiles.shared_bytes() <= SHARED_LIMIT
        np.testing.assert_allclose(as64(skinny_matmul(x, w, tiles)), want, rtol=2**-7, atol=1e-3)


def random_case(rows: int, n: int, k: int, dtype: mx.Dtype):
    rng = np.random.default_rng()
    x = mx.array((rng.standard_normal((rows, 1, k)) * 3).astype(np.float32)).astype(dtype)
    w = mx.array((rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32)).astype(dtype)
    g = mx.array(rng.uniform(0.5, 1.5, k).astype(np.float32)).astype(dtype)
    return x, w, g


def normed_product64(x: mx.array, w: mx.array, g: mx.array, eps: float, dtype: mx.Dtype):
    """rms_norm(x) g @ w.T in float64 and its bound (the module's docstring)."""
    x64, w64, g64 = as64(x)[:, 0], as64(w), as64(g)
    inverse = 1 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + eps)
    terms = np.abs(x64 * g64) @ np.abs(w64).T * inverse
    want = (x64 * g64 * inverse) @ w64.T
    return want, ROUNDING[dtype] * terms + x64.shape[1] * 2.0**-24 * terms


@needs_cuda
@pytest.mark.parametrize("rows, n, tiles", [(32, 133 * 64, Tiles(2, 8, 4, 3, loop=True)),    # the last block: 1 tile
                                            (5, 300 * 32, Tiles(1, 4, 8, 3, loop=True)),
                                            (32, 24576, None)])
def test_a_looping_launch_computes_the_product_of_one_tile_a_block(rows, n, tiles):
    # Each block's rings run on from one column tile into the next (Tiles.loop): every tile's products and
    # sums must be its own, whichever block and position in the block's sequence it has.
    rng = np.random.default_rng()
    k = 1024
    x = mx.array(rng.standard_normal((rows, 1, k)).astype(np.float32)).astype(mx.bfloat16)
    w = mx.array((rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32)).astype(mx.bfloat16)
    tiles = tiles or tiles_for(rows, n)
    assert tiles.loop and tiles.blocks(n) < tiles.column_tiles(n)
    got = as64(skinny_matmul(x, w, tiles))[:, 0]
    np.testing.assert_array_equal(got, as64(skinny_matmul(x, w, replace(tiles, loop=False)))[:, 0])
    x64, w64 = as64(x)[:, 0], as64(w)
    want = x64 @ w64.T
    bound = ROUNDING[mx.bfloat16] * np.abs(want) + k * 2.0**-24 * (np.abs(x64) @ np.abs(w64).T)
    assert np.all(np.abs(got - want) <= bound), np.abs(got - want).max()


@needs_cuda
@pytest.mark.parametrize("rows, n, k", [(32, 6144, 4096), (1, 4096, 4096), (20, 200, 192), (MAX_ROWS, 1024, 12288),
                                        (48, 6144, 1024)])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bfloat16", "float16"])
def test_the_norm_on_the_way_in_matches_float64(rows, n, k, dtype, kernel):
    x, w, g = random_case(rows, n, k, dtype)
    eps = 1e-5
    want, bound = normed_product64(x, w, g, eps, dtype)
    bound = 1.25 * (bound + ROUNDING[dtype] * np.abs(want))
    got = as64(skinny_matmul(x, w, norm=(g, eps)))[:, 0]
    assert np.all(np.abs(got - want) <= bound), np.abs(got - want).max()
    unnormed = as64(x)[:, 0] * as64(g) @ as64(w).T      # the norm's 1/rms left out
    assert np.mean(np.abs(unnormed - want) > bound) > 0.5


@needs_cuda
@pytest.mark.parametrize("rows, n, k", [(32, 4096, 4096), (5, 24, 64), (MAX_ROWS, 4096, 12288)])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bfloat16", "float16"])
def test_the_residual_add_matches_float64(rows, n, k, dtype, kernel):
    x, w, _ = random_case(rows, n, k, dtype)
    residual = mx.array(np.random.default_rng().standard_normal((rows, 1, n)).astype(np.float32)).astype(dtype)
    x64, w64 = as64(x)[:, 0], as64(w)
    product = x64 @ w64.T
    want = product + as64(residual)[:, 0]
    u = ROUNDING[dtype]
    bound = 1.25 * u * (np.abs(product) + np.abs(want)) + k * 2.0**-24 * (np.abs(x64) @ np.abs(w64).T)
    got = as64(skinny_matmul(x, w, residual=residual))[:, 0]
    assert np.all(np.abs(got - want) <= bound), np.abs(got - want).max()
    assert np.mean(np.abs(product - want) > bound) > 0.5       # the residual is really added


def swiglu64(x: mx.array, w: mx.array, g: mx.array, eps: float, dtype: mx.Dtype):
    """swiglu of rms_norm(x) g @ w.T's halves (gate, up) in float64, its bound, and the halves."""
    product, error = normed_product64(x, w, g, eps, dtype)
    gate, up = np.split(product, 2, axis=1)
    gate_error, up_error = np.split(error + ROUNDING[dtype] * np.abs(product), 2, axis=1)   # each rounded
    sigmoid = 1 / (1 + np.exp(-gate))
    want = gate * sigmoid * up
    # silu's slope is at most 1.1 in size; three more rounded steps (sigmoid, gate * sigmoid, * up).
    bound = 1.25 * (1.1 * np.abs(up) * gate_error + np.abs(gate * sigmoid) * up_error
                    + 3 * ROUNDING[dtype] * np.abs(want))
    return want, bound, gate, up


@needs_cuda
@pytest.mark.parametrize("rows, n, k", [(32, 24576, 4096), (3, 48, 128), (40, 2064, 1024)])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bfloat16", "float16"])
def test_swiglu_of_the_normed_gate_and_up_matches_float64(rows, n, k, dtype, kernel):
    x, w, g = random_case(rows, n, k, dtype)
    eps = 1e-6
    want, bound, gate, up = swiglu64(x, w, g, eps, dtype)
    got = as64(skinny_matmul(x, w, norm=(g, eps), swiglu=True))[:, 0]
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= bound + 1e-6), np.abs(got - want).max()
    # The bound's operand terms grow with sqrt(K) times a typical product; a kernel that left the norm out
    # lands outside it, and one that confused gate and up is off by far more than this one is.
    unnormed_gate, unnormed_up = np.split(as64(x)[:, 0] * as64(g) @ as64(w).T, 2, axis=1)
    unnormed = unnormed_gate / (1 + np.exp(-unnormed_gate)) * unnormed_up
    assert np.mean(np.abs(unnormed - want) > bound) > 0.5
    swapped = up / (1 + np.exp(-up)) * gate
    assert 8 * np.median(np.abs(got - want)) < np.median(np.abs(swapped - want))


@needs_cuda
@pytest.mark.parametrize("rows", [1, 20, 32])
def test_the_engines_gate_up_streams_its_tensor_map_and_matches_float64(rows):
    # A gate/up weight with two or more 64-column tiles a block: on Hopper the engine's Linear makes its
    # tensor map when prepared, and the ops' normed swiglu runs producer_matmul through it (two 32-row boxes a
    # stage: gate's and up's). Its output stays within the float64 bound of the skinny kernel's test.
    from mlxcel.engine.model import Linear
    from mlxcel.kernels.cuda import hopper
    from mlxcel.kernels.cuda_layer_ops import CUDA_SKINNY_OPS
    n, k, dtype, eps = 2 * SMS * 64 + 256, 320, mx.bfloat16, 1e-6
    x, w, g = random_case(rows, n, k, dtype)
    linear = Linear(nn.Linear(k, n, bias=False))
    linear.weight = w
    linear.prepare()
    assert (linear.tensor_map() is not None) == hopper() and cuda_matmul.takes_tensor_map(w) == hopper()
    got = as64(CUDA_SKINNY_OPS.normed_swiglu(x, g, eps, linear.weight, linear.transposed(), linear.tensor_map()))
    want, bound, _, _ = swiglu64(x, w, g, eps, dtype)
    assert np.all(np.abs(got[:, 0] - want) <= bound + 1e-6), np.abs(got[:, 0] - want).max()


@needs_cuda
@pytest.mark.parametrize("epilogue", EPILOGUES, ids=str)
def test_a_looping_producer_launch_computes_what_one_tile_a_block_does(epilogue):
    # 300 column tiles on a grid of 100 blocks: each block's ring (4 chunks; K of 3 chunks and 5 for
    # swiglu's, a tile's chunks padded to whole rounds of the 4 consumer warps) wraps part-way through the
    # next tile's chunks while the consumers add a tile's sums. Every tile's outputs must be the ones a
    # block of its own computes, bit for bit (the same sums in the same order), and match float64 as the
    # tests above bound it.
    rows, k = 20, 192 if not epilogue.swiglu else 320
    tiles = Tiles(2, 8 if epilogue.swiglu else 4, 4, 4, loop=True, producer=True)
    n = 300 * 8 * tiles.n_tiles
    assert tiles.blocks(n) == 100 and tiles.shared_bytes(epilogue) <= SHARED_LIMIT
    x, w, g = random_case(rows, n, k, mx.bfloat16)
    residual = mx.array(np.random.default_rng().standard_normal((rows, 1, n)).astype(np.float32)).astype(mx.bfloat16)
    eps = 1e-6
    folds = dict(norm=(g, eps) if epilogue.norm else None, residual=residual if epilogue.add else None,
                 swiglu=epilogue.swiglu)
    got = as64(skinny_matmul(x, w, tiles, **folds))[:, 0]
    np.testing.assert_array_equal(got, as64(skinny_matmul(x, w, replace(tiles, loop=False), **folds))[:, 0])
    u = ROUNDING[mx.bfloat16]
    x64, w64 = as64(x)[:, 0], as64(w)
    sums = k * 2.0**-24 * (np.abs(x64) @ np.abs(w64).T)
    if epilogue.swiglu:       # test_swiglu_of_the_normed_gate_and_up_matches_float64's bound
        want, bound, _, _ = swiglu64(x, w, g, eps, mx.bfloat16)
        bound = bound + 1e-6
    elif epilogue.norm:       # test_the_norm_on_the_way_in_matches_float64's
        want, error = normed_product64(x, w, g, eps, mx.bfloat16)
        bound = 1.25 * (error + u * np.abs(want))
    elif epilogue.add:        # test_the_residual_add_matches_float64's
        product = x64 @ w64.T
        want = product + as64(residual)[:, 0]
        bound = 1.25 * u * (np.abs(product) + np.abs(want)) + sums
    else:                     # test_products_match_float64's
        want = x64 @ w64.T
        bound = u * np.abs(want) + sums
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= bound), np.abs(got - want).max()
