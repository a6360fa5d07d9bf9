"""The cascade cost model: calibration on this device (the portable kernels
on the CPU), its file, and the decode plan's verdict where a fused backend
runs the cascade (dispatch stood in for on the CPU; the kernels that run are
the portable ones, so the numerics are checked too)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from mlxcel import kernels
from mlxcel.engine import cost_model
from mlxcel.engine.cascade import SharedSpan
from mlxcel.engine.config import CascadeConfig
from mlxcel.engine.cost_model import CostModel
from mlxcel.engine.decode_plan import DecodePlan
from mlxcel.kernels import AttentionShape
from mlxcel.kernels.reference import reference_decode
from paged_cases import ATOL, forest_batch

ON = CascadeConfig(enabled=True, min_shared_pages=2, min_members=2).snapshot()
# 1 GB/s and no other cost: any span saving a page read pays.
CHEAP = CostModel("portable", "cpu", launch_s=0.0, bytes_per_s=1e9, state_s=0.0)


def test_calibration_measures_positive_constants_in_seconds(tmp_path):
    start = time.perf_counter()
    model = cost_model.calibrate(reps=3)
    assert time.perf_counter() - start < 20
    assert model.backend == kernels.backend_name() and model.launch_s > 0
    # Bytes per second between a slow CPU's and past any GPU's memory (the H200 measures 3.7e12).
    assert 1e7 < model.bytes_per_s < 2e13 and model.state_s >= 0
    assert cost_model.load(tmp_path) is None
    path = cost_model.save(model, tmp_path)
    assert path == tmp_path / cost_model.FILE_NAME and cost_model.load(tmp_path) == model
    other = replace(model, device="another")
    cost_model.save(other, tmp_path)                  # devices kept side by side
    assert cost_model.load(tmp_path) == model


def test_a_span_pays_when_its_reads_outweigh_its_states():
    shape = AttentionShape(8, 2, 64, mx.float32, mx.float32, 16, 0.125)
    page = 16 * 2 * 64 * 2 * 4
    model = CostModel("p", "d", launch_s=1e-6, bytes_per_s=1e9, state_s=1e-12)
    assert model.span_saving(shape, 10, 3) == pytest.approx(10 * 2 * page / 1e9 - 3 * 8 * 64 * 1e-12)
    assert model.span_saving(shape, 1, 1) < 0                       # one member reads nothing less


@pytest.fixture
def fused_dispatch(monkeypatch):
    """Plans as a fused backend (depth limit 4, the cost model consulted); the
    levels still compose from the portable partials."""
    monkeypatch.setattr(kernels, "cascade_max_depth", lambda shape: 4)
    models = {"model": CHEAP}
    monkeypatch.setattr(cost_model, "current", lambda measure: models["model"])
    return models


def plan_of(case):
    return DecodePlan(case.csr, ON, AttentionShape.of(case.q, case.k_pool, case.scale))


def check(case, plan):
    o = plan.attend(case.q, case.k_pool, case.v_pool, case.csr.last_page_len)
    ref = reference_decode(case.q, case.k_pool, case.v_pool, case.host, case.scale)
    np.testing.assert_allclose(np.array(o), ref, atol=ATOL, rtol=0)


TREES = [(6, [(4, [1, 2]), 1, 2]), (9, [1, 1])]      # 4 rows x 6 pages, 2 of them 4 more; 2 rows x 9


def test_every_span_that_pays_is_kept(rng, fused_dispatch):
    case, _ = forest_batch(rng, TREES, block_size=16)
    plan = plan_of(case)
    assert plan.plan.depth == 2 and len(plan.plan.spans) == 3
    assert plan.predicted_saving_s > 0 and "predicted saving" in plan.outcome.reason
    assert plan.outcome.predicted_saving_s == plan.predicted_saving_s
    check(case, plan)


def test_a_span_that_does_not_pay_leaves_its_pages(rng, fused_dispatch):
    # Each member's state costs as much as 4 saved page reads: the 2-row,
    # 4-page nested span (saves 4 reads, costs 8) goes private, the outer
    # spans (18 against 16, 9 against 8) stay.
    case, _ = forest_batch(rng, TREES, block_size=16)
    page = 16 * 2 * 64 * 2 * 4
    fused_dispatch["model"] = replace(CHEAP, state_s=4 * page / 1e9 / (8 * 64))
    plan = plan_of(case)
    assert sorted(s.pages for s in plan.plan.spans) == [6, 9] and plan.plan.depth == 1
    check(case, plan)


def test_nested_spans_that_do_not_pay_their_launch_fall_back_to_one_level(rng, fused_dispatch):
    # One more launch costs about what the nested span saves, two cost more
    # than everything: the one-level plan of the best span.
    case, _ = forest_batch(rng, [(6, [(4, [1, 2]), 1, 2])], block_size=16)
    page = 16 * 2 * 64 * 2 * 4
    fused_dispatch["model"] = replace(CHEAP, launch_s=8 * page / 1e9)   # outer span saves 18 reads, inner 4
    plan = plan_of(case)
    assert plan.plan.depth == 1 and "one level" in plan.outcome.reason
    assert plan.plan.spans == (SharedSpan(plan.plan.spans[0].members, 0, 6),)
    check(case, plan)
    fused_dispatch["model"] = replace(CHEAP, launch_s=100 * page / 1e9)
    plan = plan_of(case)
    assert plan.plan is None and plan.outcome.kind == "flat" and plan.outcome.predicted_saving_s < 0
    assert plan.outcome.reason.startswith("predicted saving -")
    check(case, plan)


def test_the_fused_depth_limit_caps_the_plan(rng, fused_dispatch, monkeypatch):
    case, _ = forest_batch(rng, [(4, [(3, [(2, [1, 2]), 1]), 2])], block_size=16)
    assert plan_of(case).plan.depth == 3
    monkeypatch.setattr(kernels, "cascade_max_depth", lambda shape: 2)
    plan = plan_of(case)
    assert plan.plan.depth == 2       # the innermost pages go to the private level
    check(case, plan)


def test_the_portable_kernels_take_every_span_and_only_predict(rng, monkeypatch):
    # Without a fused cascade a calibrated model predicts, never declines.
    monkeypatch.setattr(cost_model, "current", lambda measure: replace(CHEAP, launch_s=1.0))
    case, _ = forest_batch(rng, TREES, block_size=16)
    plan = plan_of(case)
    assert len(plan.plan.spans) == 3 and plan.predicted_saving_s < 0
    monkeypatch.setattr(cost_model, "current", lambda measure: None)
    assert plan_of(case).predicted_saving_s is None


def test_mlxcel_calibrate_writes_the_file(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from mlxcel_tui.cli import mlxcel

    monkeypatch.setenv("MLXCEL_HOME", str(tmp_path))
    result = CliRunner().invoke(mlxcel, ["calibrate", "--json"])
    assert result.exit_code == 0, result.output
    written = json.loads(result.output)
    assert written["file"] == str(tmp_path / cost_model.FILE_NAME) and written["launch_s"] > 0
    assert cost_model.load() == CostModel(**{k: v for k, v in written.items() if k != "file"})
