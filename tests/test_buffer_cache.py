"""MLX's buffer cache emptied between steps once it and the live arrays near the memory limit
(engine/buffer_cache.py): only then, live arrays untouched, the engine's tokens unchanged."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxcel.engine import buffer_cache
from mlxcel.engine.sequence import SamplingParams

MIB = 1 << 20


@pytest.fixture
def memory_limit():
    """Set MLX's memory limit inside a test; the old one comes back after it. The cache may hold up to the
    limit meanwhile, as MLX's GPU allocators let it (its CPU allocator keeps 32 MB by default)."""
    before = mx.get_memory_limit()
    cache_before = mx.set_cache_limit(before)
    yield mx.set_memory_limit
    mx.set_memory_limit(before)
    mx.set_cache_limit(cache_before)
    mx.clear_cache()


def cached(nbytes: int) -> None:
    """Leave ``nbytes`` of freed buffers in MLX's cache."""
    freed = mx.arange(nbytes // 4, dtype=mx.float32)     # computed: MLX may keep zeros as one broadcast scalar
    mx.eval(freed)
    del freed
    mx.synchronize()    # on a GPU the buffer joins the cache once the device is done with it


# The limits below are set from what the process holds when a test runs (other tests' models may be live):
# live arrays and cache at 0.95 of the limit are past the high water (0.9), at 0.5 below it.

def test_trim_empties_the_cache_past_the_high_water(memory_limit):
    rng = np.random.default_rng(0)
    values = rng.standard_normal(MIB).astype(np.float32)
    live = mx.array(values)
    mx.eval(live)
    mx.clear_cache()
    cached(max(4 * MIB, mx.get_active_memory() // 8))         # over 0.05 of the limit set next
    held = mx.get_cache_memory()
    assert held >= 4 * MIB
    memory_limit(int((mx.get_active_memory() + held) / 0.95))
    assert buffer_cache.trim()
    assert mx.get_cache_memory() == 0
    np.testing.assert_array_equal(np.array(live), values)     # a live array is not the cache's


def test_trim_leaves_the_cache_below_the_high_water(memory_limit):
    mx.clear_cache()
    cached(4 * MIB)
    held = mx.get_cache_memory()
    assert held >= 4 * MIB
    memory_limit(int((mx.get_active_memory() + held) / 0.5))
    assert not buffer_cache.trim()
    assert mx.get_cache_memory() == held


def test_trim_leaves_a_small_cache_beside_large_live_arrays(memory_limit):
    live = mx.zeros((4 * MIB,), mx.float32)                   # 16 MiB live
    mx.eval(live)
    mx.clear_cache()
    cached(MIB // 2)
    held = mx.get_cache_memory()
    assert held >= MIB // 2
    limit = int((mx.get_active_memory() + held) / 0.95)       # past the high water ...
    assert held < buffer_cache.CACHE_SHARE * limit             # ... with a cache under 0.05 of the limit
    memory_limit(limit)
    assert not buffer_cache.trim()
    assert mx.get_cache_memory() == held


def test_engine_tokens_unchanged_when_it_trims(make_engine, monkeypatch):
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(3, 1000, n)] for n in (40, 70, 33)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)

    def generate():
        engine = make_engine()
        seqs = [engine.submit(p, params) for p in prompts]
        engine.run_until_idle()
        return engine, [s.completion_token_ids for s in seqs]

    _, want = generate()
    # Every step empties the cache: thresholds at zero (a memory limit under the live arrays would not do, as
    # MLX's allocator then empties the cache itself at each allocation the cache cannot serve).
    monkeypatch.setattr(buffer_cache, "HIGH_WATER", 0.0)
    monkeypatch.setattr(buffer_cache, "CACHE_SHARE", 0.0)
    trims, cache_before = [], []
    real = buffer_cache.trim
    monkeypatch.setattr(buffer_cache, "trim", lambda: cache_before.append(mx.get_cache_memory()) or
                        trims.append(real()) or trims[-1])
    engine, got = generate()
    assert all(trims) and any(cache_before)       # every step trimmed, some of them a cache holding buffers
    assert engine.metrics.registry.get_sample_value("mlxcel_mlx_cache_clears_total") == len(trims)
    assert got == want and any(len(set(t)) > 1 for t in got)   # tokens that vary
