"""The decoder layer's small ops (mlxcel.kernels.layer_ops) against float64.

Run on whatever the active backend is: MLX's own ops on the CPU, the fused
CUDA kernels on a CUDA device (where they are also checked against MLX's
ops). Fresh random inputs each test, positions up to 40K so the rope's angles
are far outside [-pi, pi].

Tolerance: the ops round to the activations' dtype at MLX's points (the sum,
the normalized head, the output), so a bfloat16 result may be off by up to
three roundings of 2^-8 relative each, amplified by at most 2 by the rope's
two-term sums; 2^-5 of the output's scale holds that with room. float32 adds
~1e-6 relative per op on top of the reference's exact math, but the rope's
angle is a float32 product (in MLX's rope as in the kernel), off by up to
position x 2^-23 radians from exact (inverse frequencies rounded too): at
positions below 40K, 40000 x 2^-22 of the output's scale.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.rope_utils import Llama3RoPE

from mlxcel.kernels.kv_quant import FORMATS, KVQuant, QuantizedPages, quantize
from mlxcel.kernels.layer_ops import COMPOSED, HeadSplit, PoolSlots, layer_ops
from paged_cases import random_pools

DTYPES = {"bfloat16": (mx.bfloat16, 2.0**-5), "float32": (mx.float32, 1e-5)}
MAX_POSITION = 40000
ANGLE_TOLERANCE = MAX_POSITION * 2.0**-22


def as64(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32), dtype=np.float64)


def rms_norm64(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope64(x: np.ndarray, positions: np.ndarray, inverse: np.ndarray, traditional: bool) -> np.ndarray:
    """x [T, H, D] rotated at each row's position (the half-split or neighbour-pair layout)."""
    angle = positions[:, None, None] * inverse[None, None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    if traditional:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def assert_close(got: mx.array, want: np.ndarray, tolerance: float) -> None:
    scale = np.abs(want).max()
    assert scale > 0
    np.testing.assert_allclose(as64(got), want, rtol=0, atol=tolerance * scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_matches_float64(dtype):
    mx_dtype, tolerance = DTYPES[dtype]
    rng = np.random.default_rng()
    rows, width, eps = 37, 1024, 1e-6
    residual, delta = (mx.array(rng.normal(size=(rows, 1, width)) * 3, mx_dtype) for _ in range(2))
    weight = mx.array(rng.uniform(0.5, 1.5, width), mx_dtype)
    total, normed = layer_ops().add_rms_norm(residual, delta, weight, eps)
    assert total.shape == normed.shape == (rows, 1, width) and normed.dtype == mx_dtype
    want_total = as64(residual) + as64(delta)
    assert_close(total, want_total, tolerance)
    assert_close(normed, rms_norm64(want_total, as64(weight), eps), tolerance)


def qwen3_heads(d: int, dtype: mx.Dtype, traditional: bool, rng) -> HeadSplit:
    q_norm, k_norm = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
    q_norm.weight = mx.array(rng.uniform(0.5, 1.5, d), dtype)
    k_norm.weight = mx.array(rng.uniform(0.5, 1.5, d), dtype)
    return HeadSplit(8, 2, d, nn.RoPE(d, traditional=traditional, base=1e6), q_norm, k_norm)


def llama3_heads(d: int, dtype: mx.Dtype, traditional: bool, rng) -> HeadSplit:
    rope = Llama3RoPE(d, max_position_embeddings=131072, traditional=traditional, base=500000.0,
                      scaling_config={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192})
    return HeadSplit(8, 2, d, rope, None, None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["qwen3", "llama3"])
@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_split_heads_matches_float64(dtype, family, traditional, d):
    mx_dtype, tolerance = DTYPES[dtype]
    tolerance = max(tolerance, ANGLE_TOLERANCE)
    rng = np.random.default_rng()
    heads = (qwen3_heads if family == "qwen3" else llama3_heads)(d, mx_dtype, traditional, rng)
    assert heads.frequencies is not None
    rows = 19
    qkv = mx.array(rng.normal(size=(rows, 1, (8 + 2 * 2) * d)), mx_dtype)
    positions = mx.array(rng.integers(0, MAX_POSITION, rows), mx.int32)
    q, k, v = layer_ops().split_heads(heads, qkv, positions)
    assert (q.shape, k.shape, v.shape) == ((rows, 8, d), (rows, 2, d), (rows, 2, d))

    x = as64(qkv).reshape(rows, 12, d)
    qx, kx = x[:, :8], x[:, 8:10]
    if heads.q_norm is not None:
        qx = rms_norm64(qx, as64(heads.q_norm.weight), 1e-6)
        kx = rms_norm64(kx, as64(heads.k_norm.weight), 1e-6)
    inverse, position_scale, _ = heads.frequencies
    p = np.array(positions, dtype=np.float64) * position_scale
    assert_close(q, rope64(qx, p, as64(inverse), traditional), tolerance)
    assert_close(k, rope64(kx, p, as64(inverse), traditional), tolerance)
    np.testing.assert_array_equal(np.array(v.astype(mx.float32)), np.array(qkv.astype(mx.float32)).reshape(
        rows, 12, d)[:, 10:])
    # The same numbers MLX's own ops give (on the CPU these are MLX's ops).
    cq, ck, _ = COMPOSED.split_heads(heads, qkv, positions)
    assert_close(q, as64(cq), tolerance)
    assert_close(k, as64(ck), tolerance)


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
@pytest.mark.parametrize("traditional", [False, True])
def test_one_rope_over_q_and_k_gives_mlx_lms_two_bit_for_bit(family, traditional):
    # The composed split ropes q's and k's heads in one call; mlx-lm's attention ropes each on its own.
    rng = np.random.default_rng()
    d = 64
    heads = (qwen3_heads if family == "qwen3" else llama3_heads)(d, mx.bfloat16, traditional, rng)
    rows = 7
    qkv = mx.array(rng.normal(size=(rows, 1, 12 * d)), mx.bfloat16)
    positions = mx.array(rng.integers(0, MAX_POSITION, rows), mx.int32)
    q, k, _ = COMPOSED.split_heads(heads, qkv, positions)
    x = qkv.reshape(rows, 1, 12, d)
    qx, kx = x[:, :, :8], x[:, :, 8:10]
    if heads.q_norm is not None:
        qx, kx = heads.q_norm(qx), heads.k_norm(kx)
    for got, part in ((q, qx), (k, kx)):
        want = heads.rope(part.transpose(0, 2, 1, 3), offset=positions)[:, :, 0]
        assert not mx.array_equal(want, part[:, 0])       # rotated: positions are not all 0
        np.testing.assert_array_equal(np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32)))


def test_rope_frequencies_decline_what_the_kernel_cannot_spell():
    from mlx_lm.models.rope_utils import SuScaledRoPE

    scaled = SuScaledRoPE(64, base=10000.0, max_position_embeddings=131072, original_max_position_embeddings=4096,
                          short_factor=[1.0] * 32, long_factor=[2.0] * 32, long_mscale=1.2)
    assert HeadSplit(8, 2, 64, scaled, None, None).frequencies is None        # scales its input
    assert HeadSplit(8, 2, 128, nn.RoPE(64), None, None).frequencies is None  # rotates half the head only
    q = mx.random.normal((3, 1, 8 * 64))
    # Declined ropes still split (MLX's ops): the result is rope applied by the module itself.
    k = mx.random.normal((3, 1, 2 * 64))
    positions = mx.array([0, 5, 900], mx.int32)
    out_q, _, _ = HeadSplit(8, 2, 64, scaled, None, None).rotate(q, k, k, positions)
    want = scaled(q.reshape(3, 1, 8, 64).transpose(0, 2, 1, 3), offset=positions)[:, :, 0]
    np.testing.assert_array_equal(np.array(out_q), np.array(want))


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_heads_stores_k_and_v_in_the_pool_slots(dtype):
    """With pool slots the op stores k and v itself (the CUDA kernel, in place) or hands them back for the
    caller's scatter (MLX's ops); either way the pool holds them at the slots and nothing else changed."""
    mx_dtype, tolerance = DTYPES[dtype]
    tolerance = max(tolerance, ANGLE_TOLERANCE)
    rng = np.random.default_rng()
    d, blocks, block_size, rows = 128, 9, 16, 11
    heads = qwen3_heads(d, mx_dtype, False, rng)
    keys = mx.array(rng.normal(size=(blocks, block_size, 2, d)), mx_dtype)
    values = mx.array(rng.normal(size=(blocks, block_size, 2, d)), mx_dtype)
    before_k, before_v = as64(keys), as64(values)
    slot_ids = rng.choice(blocks * block_size, rows, replace=False)
    slot_blocks = mx.array(slot_ids // block_size, mx.int32)
    slot_offsets = mx.array(slot_ids % block_size, mx.int32)
    qkv = mx.array(rng.normal(size=(rows, 1, 12 * d)), mx_dtype)
    positions = mx.array(rng.integers(0, MAX_POSITION, rows), mx.int32)

    slots = PoolSlots(keys, values, slot_blocks, slot_offsets)
    q, k, v = layer_ops().split_heads(heads, qkv, positions, slots)
    if k is not None:
        keys[slot_blocks, slot_offsets] = k
        values[slot_blocks, slot_offsets] = v
    mx.eval(q, keys, values)

    want_q, want_k, want_v = COMPOSED.split_heads(heads, qkv, positions)
    assert_close(q, as64(want_q), tolerance)
    got_k, got_v = as64(keys), as64(values)
    b, o = slot_ids // block_size, slot_ids % block_size
    assert_close(mx.array(got_k[b, o]), as64(want_k), tolerance)
    np.testing.assert_array_equal(got_v[b, o], as64(want_v))
    untouched = np.ones((blocks, block_size), bool)
    untouched[b, o] = False
    np.testing.assert_array_equal(got_k[untouched], before_k[untouched])
    np.testing.assert_array_equal(got_v[untouched], before_v[untouched])


def quantize_reference(x: np.ndarray, fmt: KVQuant) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """kv_quant's page format spelled in NumPy float32 (IEEE divisions, float16
    rounding to nearest even, round half to even): (codes unpacked [..., D],
    scales, zeros) of x [..., D]."""
    x = x.astype(np.float32)
    one = np.float32(1)
    if not fmt.affine:
        scale = (np.abs(x).max(-1, keepdims=True) / np.float32(127)).astype(np.float16)
        step = scale.astype(np.float32)
        return np.clip(np.rint(x / np.where(step > 0, step, one)), -127, 127), scale, None
    grouped = x.reshape(*x.shape[:-1], -1, fmt.group)
    zero = grouped.min(-1, keepdims=True).astype(np.float16)
    low = zero.astype(np.float32)
    scale = ((grouped.max(-1, keepdims=True) - low) / np.float32(15)).astype(np.float16)
    step = scale.astype(np.float32)
    codes = np.clip(np.rint((grouped - low) / np.where(step > 0, step, one)), 0, 15).reshape(x.shape)
    return codes, scale[..., 0], zero[..., 0]


def stored(pages: QuantizedPages) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(codes unpacked [..., D] as int, scales, zeros) of pages, in NumPy."""
    codes = np.array(pages.codes).astype(np.int64)
    if pages.format.affine:
        codes = np.stack([codes & 15, codes >> 4], axis=-1).reshape(*codes.shape[:-1], -1)
    return codes, np.array(pages.scales), None if pages.zeros is None else np.array(pages.zeros)


def dequantized64(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(the values codes stand for, each element's step), in float64."""
    d = codes.shape[-1]
    per_channel = (lambda a: np.repeat(a.astype(np.float64), d // a.shape[-1], axis=-1))
    step = per_channel(scales)
    return codes * step + (0 if zeros is None else per_channel(zeros)), step


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("family", ["qwen3", "llama3"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_split_heads_quantizes_k_and_v_into_quantized_pool_slots(fmt, family, dtype, d):
    """Into a quantized pool the op stores k and v quantized once (the CUDA kernel, in place, as it stores;
    MLX's ops: the caller's QuantizedPages.write), exactly kv_quant's format: the codes, scales and zeros at
    the slots are the format's of the k and v the op computes, bit for bit (the float32 math is specified
    down to its roundings: no tolerance), and nothing else in the pool changed.

    The k the store quantizes is the op's own (on CUDA the kernel without a pool computes it the same way);
    against MLX's composed k it is within the op's tolerance (test_split_heads_matches_float64), so the
    stored values are within half a step (plus float32's rounding of x / step: 2^-8 of it with room) of
    each, plus that tolerance. v is copied unchanged: its pages equal kv_quant.quantize of MLX's own v."""
    mx_dtype, tolerance = DTYPES[dtype]
    tolerance = max(tolerance, ANGLE_TOLERANCE)
    quant = FORMATS[fmt]
    rng = np.random.default_rng()
    blocks, block_size, rows = 9, 16, 11
    # Both rope layouts: Qwen3 half-split with q/k norms, Llama 3 neighbour pairs without.
    heads = qwen3_heads(d, mx_dtype, False, rng) if family == "qwen3" else llama3_heads(d, mx_dtype, True, rng)
    # Fresh (row-contiguous) arrays, as the engine's pool allocates them: MLX hands a kernel a copy of an
    # input it does not see as row-contiguous, and a store into a copy is lost.
    keys, values = (QuantizedPages(*(None if part is None else mx.array(np.array(part)) for part in pages))
                    for pages in random_pools(rng, blocks, block_size, 2, d, dtype=fmt))
    before = [stored(pages) for pages in (keys, values)]
    slot_ids = rng.choice(blocks * block_size, rows, replace=False)
    slot_blocks = mx.array(slot_ids // block_size, mx.int32)
    slot_offsets = mx.array(slot_ids % block_size, mx.int32)
    x = rng.normal(size=(rows, 1, 12 * d)) * 2
    x[0] = 0                # the scales' edge cases: a zero head (scale 0) and a constant one (int4: max == min)
    x[1, :, 10 * d:] = 0.75
    qkv = mx.array(x, mx_dtype)
    positions = mx.array(rng.integers(0, MAX_POSITION, rows), mx.int32)

    q, k, v = layer_ops().split_heads(heads, qkv, positions, PoolSlots(keys, values, slot_blocks, slot_offsets))
    if k is not None:
        keys.write(slot_blocks, slot_offsets, k)
        values.write(slot_blocks, slot_offsets, v)
    mx.eval(q, keys, values)

    own_q, own_k, own_v = layer_ops().split_heads(heads, qkv, positions)
    want_q, want_k, want_v = COMPOSED.split_heads(heads, qkv, positions)
    assert_close(q, as64(want_q), tolerance)
    b, o = slot_ids // block_size, slot_ids % block_size
    untouched = np.ones((blocks, block_size), bool)
    untouched[b, o] = False
    for pages, own, composed, old in ((keys, own_k, want_k, before[0]), (values, own_v, want_v, before[1])):
        now = stored(pages)
        got = [None if part is None else part[b, o] for part in now]
        want = quantize_reference(np.array(own.astype(mx.float32)), quant)
        assert np.abs(want[0]).max() > 2 and np.unique(want[1]).size > rows     # codes and scales vary
        assert (got[2] is None) == (want[2] is None) == (not quant.affine)
        mlx_ops = stored(QuantizedPages(*quantize(own, quant)))                # the composed store's quantizer
        for got_part, want_part, mlx_part in zip(got, want, mlx_ops):
            if want_part is not None:
                np.testing.assert_array_equal(got_part, want_part)
                np.testing.assert_array_equal(mlx_part, want_part)
        for part, was in zip(now, old):
            if part is not None:
                np.testing.assert_array_equal(part[untouched], was[untouched])
        value, step = dequantized64(*got)
        bound = 0.5 * step * (1 + 2.0**-8)
        assert np.all(np.abs(value - as64(own)) <= bound)
        assert np.all(np.abs(value - as64(composed)) <= bound + tolerance * np.abs(as64(composed)).max())
    # v is copied unchanged: its pages are exactly the format's quantization of MLX's own v.
    for got_part, want_part in zip(stored(values), quantize_reference(np.array(want_v.astype(mx.float32)), quant)):
        if want_part is not None:
            np.testing.assert_array_equal(got_part[b, o], want_part)
