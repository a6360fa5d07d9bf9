"""Shared fixtures: the embedded model generated once per session into a temp
MLXCEL_HOME, and small engines over it."""

from __future__ import annotations

import os

import numpy as np
import pytest

# The float32 checks assert float32 arithmetic (1e-5 against float64). MLX
# runs float32 matmuls as TF32 on NVIDIA GPUs unless this is 0 (~1e-4 off,
# measured on the H200); it is read when MLX first runs a matmul, so it is set
# before any test does. No effect on the CPU.
os.environ.setdefault("MLX_ENABLE_TF32", "0")


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random inputs every run; the seed is printed, so pytest shows it on failure."""
    seed = int(np.random.SeedSequence().entropy % (1 << 63))
    print(f"random seed {seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def on_the_cpu():
    """The test on the CPU device, whatever the machine's default: on a GPU a trace's fused kernels round as
    their own code does, not as the ops one by one, so bit-for-bit checks of traces mean the CPU's."""
    import mlx.core as mx

    device = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(device)


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test."""
    import socket

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture(scope="session")
def mlxcel_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("mlxcel-home")
    os.environ["MLXCEL_HOME"] = str(home)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return home


@pytest.fixture(scope="session")
def tiny_model_path(mlxcel_home):
    from mlxcel.engine.builtin_models import tiny_model_path

    return tiny_model_path(mlxcel_home)


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_path):
    """The embedded model loaded once; engines built on it share its weights."""
    from mlxcel.engine.model import load_model
    from mlxcel.engine.builtin_models import TINY_MODEL_NAME

    return load_model(tiny_model_path, TINY_MODEL_NAME)


@pytest.fixture
def make_engine(tiny_loaded):
    """Build engines on the embedded model; each gets its own pool and metrics."""
    from mlxcel.engine.config import CascadeConfig, EngineConfig
    from mlxcel.engine.engine import Engine

    engines = []

    def build(enabled=False, min_shared_pages=2, min_members=2, num_blocks=256, loaded=None, **kwargs):
        engine = Engine(loaded or tiny_loaded, EngineConfig(num_blocks=num_blocks, **kwargs),
                        cascade=CascadeConfig(enabled, min_shared_pages, min_members))
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.stop()
