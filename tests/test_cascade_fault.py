"""A cascade launch that raises: the flat launch serves the same step, the
failure is counted, and every output is what cascade-off produces."""

from __future__ import annotations

import pytest
from reliability import assert_pool_at_baseline

from mlxcel import kernels
from mlxcel.engine.attention import ComposedCascade
from mlxcel.engine.sequence import SamplingParams

SHARED = [(11 * i) % 900 + 5 for i in range(3 * 32)]  # three shared pages
PROMPTS = [SHARED + [300 + q, 301 + q] for q in range(3)]
PARAMS = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(tiny_loaded):
    """The outputs with cascade off."""
    from mlxcel.engine.config import CascadeConfig, EngineConfig
    from mlxcel.engine.engine import Engine

    return Engine(tiny_loaded, EngineConfig(num_blocks=32), cascade=CascadeConfig()).generate(PROMPTS, PARAMS)


def sample(engine, name, path=None):
    labels = {"path": path} if path else {}
    return engine.metrics.registry.get_sample_value(name, labels) or 0


@pytest.fixture
def failing_cascade(monkeypatch):
    """Every planned cascade launch raises in its first layer (as a broken
    kernel would); counts the attempts."""
    attempts = []

    def broken(*args, **kwargs):
        attempts.append(1)
        raise RuntimeError("injected cascade fault")

    monkeypatch.setattr(kernels, "prepare_cascade", lambda *a: None)   # the composed levels, on every backend
    monkeypatch.setattr(ComposedCascade, "__call__", broken)
    return attempts


def test_failed_cascade_falls_back_to_flat_with_the_same_outputs(make_engine, failing_cascade, reference):
    engine = make_engine(enabled=True, min_shared_pages=2, min_members=2, num_blocks=32)
    outputs = engine.generate(PROMPTS, PARAMS)
    assert failing_cascade, "cascade was never planned, so nothing was injected"
    assert outputs == reference
    # A step whose first layer fails runs flat in every layer; the next step tries again.
    failures = sample(engine, "mlxcel_cascade_failures_total")
    assert failures == len(failing_cascade) * engine.loaded.num_layers
    assert sample(engine, "mlxcel_paged_decode_launches_total", "cascade") == 0
    assert sample(engine, "mlxcel_paged_decode_launches_total", "fused_v2") >= failures
    assert engine.snapshot.last_path == "fused_v2"
    assert_pool_at_baseline(engine)


def test_cascade_counts_no_failure_when_it_works(make_engine, reference):
    engine = make_engine(enabled=True, min_shared_pages=2, min_members=2, num_blocks=32)
    assert engine.generate(PROMPTS, PARAMS) == reference
    assert sample(engine, "mlxcel_paged_decode_launches_total", "cascade") > 0
    assert sample(engine, "mlxcel_cascade_failures_total") == 0
