"""The CPU's layer ops (mlxcel.kernels.cpu_layer_ops): the composed ops' outputs bit for bit, in fewer graph nodes.

Against float64 they are checked by test_layer_ops (``layer_ops()`` is them on the CPU); here against MLX's own
composed ops, exactly: the same ops on the same values (see the module), so no tolerance.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxcel.kernels.cpu_layer_ops import CPU_OPS, CpuOps
from mlxcel.kernels.layer_ops import COMPOSED, HeadSplit, layer_ops
from test_layer_ops import MAX_POSITION, llama3_heads, qwen3_heads

DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}


pytestmark = pytest.mark.usefixtures("on_the_cpu")   # the CPU's ops on the CPU device (conftest)


def random_step(heads: HeadSplit, dtype: mx.Dtype, rows: int, rng) -> tuple[mx.array, mx.array]:
    width = (heads.n_heads + 2 * heads.n_kv_heads) * heads.head_dim
    qkv = mx.array(rng.normal(size=(rows, 1, width)) * 3, dtype)
    return qkv, mx.array(rng.integers(0, MAX_POSITION, rows), mx.int32)


def assert_bitwise(got: tuple, want: tuple) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert mx.array_equal(a, b).item()


def nodes(*arrays: mx.array) -> int:
    import io
    dot = io.StringIO()
    mx.export_to_dot(dot, *arrays)
    return dot.getvalue().count("label")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["qwen3", "llama3"])
@pytest.mark.parametrize("traditional", [False, True])
def test_split_heads_gives_the_composed_ops_bit_for_bit(dtype, family, traditional):
    rng = np.random.default_rng()
    heads = (qwen3_heads if family == "qwen3" else llama3_heads)(64, DTYPES[dtype], traditional, rng)
    qkv, positions = random_step(heads, DTYPES[dtype], 19, rng)
    q, k, v = CpuOps().split_heads(heads, qkv, positions)
    cq, ck, cv = COMPOSED.split_heads(heads, qkv, positions)
    assert not mx.array_equal(q, qkv.reshape(19, 12, 64)[:, :8]).item()     # rotated (and normed)
    assert_bitwise((q, k, v), (cq, ck, cv))


def test_split_heads_builds_fewer_nodes_and_one_set_of_tables_a_step():
    rng = np.random.default_rng()
    heads = qwen3_heads(64, mx.float32, False, rng)
    qkv, positions = random_step(heads, mx.float32, 8, rng)
    mx.eval(qkv, positions)
    ops = CpuOps()
    first = ops.split_heads(heads, qkv, positions)
    tables = ops.tables(heads, positions, 10, mx.float32)
    mx.eval(tables.cos, tables.signed_sin)
    # Another layer of the step (another rope module alike): its tables are the step's.
    twin = qwen3_heads(64, mx.float32, False, rng)
    second = ops.split_heads(twin, qkv, positions)
    assert ops.tables(twin, positions, 10, mx.float32) is tables
    assert nodes(*second) < nodes(*COMPOSED.split_heads(twin, qkv, positions)) / 2
    # The next step's positions: tables of their own.
    later = positions + 1
    assert ops.tables(heads, later, 10, mx.float32) is not tables
    assert_bitwise(first, COMPOSED.split_heads(heads, qkv, positions))


def test_split_heads_declines_norms_unlike_but_for_their_weights():
    rng = np.random.default_rng()
    heads = qwen3_heads(64, mx.float32, False, rng)
    heads.k_norm.eps = 1e-5
    assert not heads.norms_agree()
    qkv, positions = random_step(heads, mx.float32, 5, rng)
    assert_bitwise(CpuOps().split_heads(heads, qkv, positions), COMPOSED.split_heads(heads, qkv, positions))
    q_only = HeadSplit(8, 2, 64, nn.RoPE(64), heads.q_norm, None)
    assert not q_only.norms_agree()


def test_layer_ops_are_the_cpu_ones_on_the_cpu(monkeypatch):
    assert mx.default_device().type == mx.DeviceType.cpu
    monkeypatch.delenv("MLXCEL_LAYER_OPS", raising=False)
    assert layer_ops() is CPU_OPS
    monkeypatch.setenv("MLXCEL_LAYER_OPS", "composed")
    assert layer_ops() is COMPOSED
