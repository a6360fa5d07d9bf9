"""MLX's CUDA graph byte bound, widened for the pool the serve command makes
(engine/graph_bound.py). The bound only matters on a CUDA device; these tests
stand one in (mx.cuda.is_available) and check what the command writes to the
environment, and that the pool it sizes before the load is the engine's."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxcel.engine import graph_bound
from mlxcel.engine.config import EngineConfig
from mlxcel.engine.model import config_pool_geometry
from mlxcel.engine.pool import PoolGeometry

ENV = graph_bound.BYTE_BOUND_ENV


@pytest.fixture
def on_cuda(monkeypatch):
    # Set first, so that monkeypatch puts the variable back as it was (absent too) after the test.
    monkeypatch.setenv(ENV, "0")
    monkeypatch.delenv(ENV)
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)


def test_the_bound_adds_two_cascade_layers_counts_of_the_pool():
    # A layer's K and V of 625 MiB (5,000 pages of an 8B model's bf16): six counts over MLX's 1000 MB.
    layer = PoolGeometry.named(36, 8, 128, 32, "bfloat16").bytes_per_block // 36 * 5000
    assert graph_bound.bound_mb(layer) == 1000 + 6 * 625
    assert graph_bound.bound_mb(0) == graph_bound.MLX_HOPPER_MB
    assert graph_bound.bound_mb(1) == 1006                      # a part of a MB counts as one


def test_widening_sets_the_pools_bound(on_cuda):
    graph_bound.widen_for_pool(PoolGeometry.named(36, 8, 128, 32, "bfloat16"), 5000)
    assert graph_bound.os.environ[ENV] == "4750"                 # 1000 + 6 x 625 MiB


def test_widening_leaves_a_value_the_environment_names(on_cuda, monkeypatch):
    monkeypatch.setenv(ENV, "123")
    graph_bound.widen_for_pool(PoolGeometry.named(36, 8, 128, 32, "bfloat16"), 5000)
    assert graph_bound.os.environ[ENV] == "123"


def test_nothing_is_set_without_a_cuda_device(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    monkeypatch.delenv(ENV)
    monkeypatch.setattr(mx.cuda, "is_available", lambda: False)
    graph_bound.widen_for_pool(PoolGeometry.named(36, 8, 128, 32, "bfloat16"), 5000)
    assert ENV not in graph_bound.os.environ


def test_the_config_gives_the_loaded_models_pool(tiny_loaded, tiny_model_path):
    from mlxcel.engine.engine import Engine

    for kv_dtype in (None, "bfloat16", "int8"):
        geometry = config_pool_geometry(tiny_model_path, 16, kv_dtype)
        engine = Engine(tiny_loaded, EngineConfig(block_size=16, kv_dtype=kv_dtype, pool_bytes=3 << 20))
        assert geometry == engine.pool.geometry
        assert EngineConfig(block_size=16, pool_bytes=3 << 20).pool_blocks(geometry) == engine.pool.num_blocks


@pytest.mark.parametrize("sizing", [{"kv_blocks": 40}, {"kv_cache_mb": 3}, {}])
def test_the_serve_commands_bound_is_its_engines_pools(on_cuda, sizing):
    from mlxcel_tui.workload import build_engine

    engine = build_engine("tiny", cascade=None, min_shared_pages=None, min_members=None, **sizing)
    pool = engine.pool
    layer_bytes = pool.num_blocks * pool.geometry.bytes_per_block // pool.geometry.num_layers
    assert graph_bound.os.environ[ENV] == str(graph_bound.bound_mb(layer_bytes))
    assert layer_bytes > 0
