import mlx.core as mx
import numpy as np
import pytest

from mlxcel.engine.pool import BlockPool, PoolExhausted, PoolGeometry


def make_pool(num_blocks=8, dtype=mx.float32, block_size=4):
    return BlockPool(PoolGeometry(num_layers=2, num_kv_heads=2, head_dim=8, block_size=block_size, dtype=dtype),
                     num_blocks)


def pool_state(pool):
    return list(pool.refcount), list(pool.free), list(pool.reusable)


def test_geometry_layout_and_byte_budget():
    geo = PoolGeometry(num_layers=3, num_kv_heads=2, head_dim=16, block_size=32, dtype=mx.float16)
    assert geo.bytes_per_block == 2 * 3 * 32 * 2 * 16 * 2
    pool = BlockPool.from_bytes(geo, 10 * geo.bytes_per_block + 5)
    assert pool.num_blocks == 10
    assert pool.keys[0].shape == (10, 32, 2, 16) and pool.keys[0].dtype == mx.float16
    assert len(pool.keys) == len(pool.values) == 3


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_write_lands_in_block_and_slot(dtype):
    pool = make_pool(dtype=dtype)
    table = pool.allocate(3)
    rng = np.random.default_rng()
    k = rng.standard_normal((6, 2, 8)).astype(np.float32)
    v = rng.standard_normal((6, 2, 8)).astype(np.float32)
    blocks, offsets = pool.slots(table, 3, 6)  # positions 3..8 span three pages
    assert blocks == [table[0], table[1], table[1], table[1], table[1], table[2]]
    assert offsets == [3, 0, 1, 2, 3, 0]
    pool.write(1, mx.array(blocks), mx.array(offsets), mx.array(k), mx.array(v))
    keys = np.array(pool.keys[1].astype(mx.float32))
    values = np.array(pool.values[1].astype(mx.float32))
    # f16/bf16 pools round to 11/8 significant bits: relative error under 2**-8.
    tol = 1e-2 if dtype != mx.float32 else 0
    for i, (b, o) in enumerate(zip(blocks, offsets)):
        np.testing.assert_allclose(keys[b, o], k[i], atol=tol, rtol=tol)
        np.testing.assert_allclose(values[b, o], v[i], atol=tol, rtol=tol)
    assert not np.array(pool.keys[0].astype(mx.float32)).any(), "another layer was written"


def test_refcounts_free_only_at_zero():
    pool = make_pool()
    a = pool.allocate(2)
    pool.incref(a)
    pool.decref(a)
    assert pool.num_available == 6
    pool.decref(a)
    assert pool.num_available == 8 and all(c == 0 for c in pool.refcount)
    with pytest.raises(ValueError):
        pool.decref(a[:1])
    with pytest.raises(ValueError):
        pool.incref(a[:1])


def test_exhaustion_changes_nothing():
    pool = make_pool()
    held = pool.allocate(5)
    pool.incref(held[:2])
    before = pool_state(pool)
    with pytest.raises(PoolExhausted) as err:
        pool.allocate(4)
    assert err.value.requested == 4 and err.value.available == 3
    assert pool_state(pool) == before


def test_kept_blocks_are_reclaimed_lru_first():
    pool = make_pool(num_blocks=3)
    kept, reclaimed = set(), []
    pool.keep_on_release = lambda b: b in kept
    pool.on_reclaim = reclaimed.append
    a, b, c = pool.allocate(3)
    kept.update({a, b})
    pool.decref([b])
    pool.decref([a])
    assert pool.num_available == 2 and not pool.free
    assert pool.allocate(1) == [b]  # released first, reclaimed first
    assert reclaimed == [b]
