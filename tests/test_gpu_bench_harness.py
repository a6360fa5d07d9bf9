"""The GPU attention bench's timing chain (runs on any device): the dependency
it threads from call to call must change no input, or a chained method would
compute something else than the method timed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_attention_bench as bench  # noqa: E402


def test_depend_adds_exactly_zero():
    mx.random.seed(7)
    for dtype in (mx.bfloat16, mx.float16, mx.float32):
        x = (mx.random.normal((3, 5, 8)) * 100).astype(dtype)
        previous = mx.random.normal((4, 6)) * 1e4     # large values: 0 x them must still be exactly 0
        got = bench.depend(x, previous)
        assert got.dtype == x.dtype
        assert np.array_equal(np.array(got.astype(mx.float32)), np.array(x.astype(mx.float32)))
    # The dependency is real data flow (what keeps MLX from overlapping chained
    # calls): 0 x inf is NaN, so an infinite first element reaches every output.
    poisoned = bench.depend(mx.ones((2, 3)), mx.array([np.inf, 1.0]))
    assert np.isnan(np.array(poisoned)).all()


def test_chain_threads_each_output_into_the_next_call():
    """Call i sees call i-1's output, and the chain's result is the last call's own output."""
    mx.random.seed(8)
    queries = [mx.random.normal((2, 4, 16)) for _ in range(3)]
    weight = mx.random.normal((16, 16))
    seen = []

    def call(i, dep):
        seen.append(dep)
        q = queries[i % 3]
        return (q if dep is None else bench.depend(q, dep)) @ weight

    out = bench.chain(call, 5)
    assert seen[0] is None and all(d is not None for d in seen[1:])
    np.testing.assert_array_equal(np.array(out), np.array(queries[4 % 3] @ weight))
    device, host, encode, with_fixed = bench.chained_rep(call, 8)
    assert host > 0 and encode >= 0 and with_fixed > 0


def test_timeline_counts_concurrent_kernels_once():
    import gpu_timeline

    # two overlapping kernels (level 0 and level 1 of a step), then a later one
    assert gpu_timeline.union_length([(0, 10), (2, 12), (20, 25)]) == 17
    assert gpu_timeline.union_length([(5, 6), (0, 10)]) == 10
    assert gpu_timeline.union_length([]) == 0


def test_timeline_summary_of_a_synthetic_trace():
    """Two calls of three kernels each, the first two of each call concurrent, as CUPTI reports them."""
    import gpu_timeline

    def kernel(name, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": f"void mlx::core::cu::{name}(float*)", "ts": ts, "dur": dur,
                "args": {"grid": [32, 8, 1]}}
    events = [{"ph": "X", "cat": "user_annotation", "name": "encode", "ts": 100.0, "dur": 50.0},
              kernel("level0", 200, 30), kernel("level1", 201, 20), kernel("merge", 231, 3),
              kernel("level0", 240, 30), kernel("level1", 241, 20), kernel("merge", 271, 3)]
    summary = gpu_timeline.summarize(2, {"wall_us": 90.0}, events)
    assert summary["kernels_per_call"] == 3
    assert summary["busy_us_per_call"] == 33                 # [200, 230] + [231, 234]; [240, 270] + [271, 274]
    assert summary["span_us_per_call"] == 37
    assert summary["idle_us_per_call"] == (74 - 66) / 2
    assert summary["first_kernel_after_encode_us"] == 100
    assert summary["kernel_median_us"] == {"level0 grid [32, 8, 1]": 30, "level1 grid [32, 8, 1]": 20,
                                           "merge grid [32, 8, 1]": 3}


def test_timeline_reads_complete_events_of_an_exported_trace():
    import json

    import gpu_timeline

    class ExportingProfiler:  # torch.profiler's export, as far as complete_events uses it
        def export_chrome_trace(self, path):
            Path(path).write_text(json.dumps({"traceEvents": [
                {"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 2.0},
                {"ph": "i", "cat": "instant", "name": "marker", "ts": 3.0},
                {"ph": "X", "cat": "user_annotation", "name": "encode", "ts": 0.0, "dur": 5.0}]}))

    events = gpu_timeline.complete_events(ExportingProfiler())
    assert [e["name"] for e in events] == ["k", "encode"]


def test_the_forest_bench_builds_and_checks_a_small_cell_on_any_device():
    # The GPU forest bench's cell, arms and checks at a size the CPU runs in
    # seconds (the portable kernels; FlashInfer where it imports).
    import gpu_forest_bench as forest

    small = forest.Forest("small", rows=8, common=64 * 32, tenants=2, sub=32 * 32, private=2 * 32)
    tables = small.tables()
    assert tables[0][:64] == tables[7][:64] and tables[0][64:96] != tables[7][64:96]
    assert tables[0][:96] == tables[3][:96]                              # rows of a tenant are contiguous
    _, arms, result = forest.checked_arms(small)
    assert result["plans"] == {"nested": {"spans": 3, "depth": 2}, "one-level": {"spans": 1, "depth": 1}}
    # The cascades and flat accumulate in float32 and round to bf16 alike (a
    # wrong span or merge errs by O(0.1)); SDPA rounds its own bf16 way.
    checks = result["checks_vs_flat"]
    assert checks["nested"] < 1e-3 and checks["one-level"] < 1e-3 and checks["sdpa"] < 2e-2
    timed = {arm: {"s": 1e-3, "iqr_s": 1e-4} for arm in ("nested", "one-level", "flat", "sdpa")}
    assert "| small | nested | 1000.0 (100.0) | 1.00 |" in forest.table([{**result, **timed}])


def test_the_matmul_sweep_names_both_kernels_launches():
    # --sweep-tiles NxWxS: skinny_matmul's launch; pNxCxS: producer_matmul's, its grid one wave of a block
    # an SM, each taking the same number of column tiles; each arm's label names it back.
    import gpu_matmul_bench as matmul
    from mlxcel.kernels.cuda_matmul import Tiles

    assert matmul.launch_shape("8x4x3", 2) == Tiles(2, 8, 4, 3)
    producer = matmul.launch_shape("p16x4x5", 2)
    assert producer == Tiles(2, 16, 4, 5, loop=True, producer=True)
    assert producer.threads() == 160 and producer.blocks(24576) == 96 and producer.blocks(128 * 300) == 100
    assert matmul.label(producer) == "producer 16x4x5"
    assert matmul.label(Tiles(2, 8, 4, 3, loop=True)) == "skinny 8x4x3 looping"
    assert all(matmul.launch_shape(shape, 2) == Tiles(2, *map(int, shape.split("x"))) for shape in matmul.SWEEP)


def test_the_e2e_reads_run_abba_with_each_cascade_matmul(monkeypatch):
    import gpu_e2e_bench as e2e
    order = e2e.arm_order(["bfloat16", "int8"], ["auto", "cublas"])
    first = [("cascade", True, "bfloat16", "auto"), ("cascade_cublas", True, "bfloat16", "cublas"),
             ("flat", False, "bfloat16", "auto"), ("cascade_int8", True, "int8", "auto"),
             ("cascade_cublas_int8", True, "int8", "cublas"), ("flat_int8", False, "int8", "auto")]
    assert order == first + [(f"{name}_2", *rest) for name, *rest in reversed(first)]
    assert [name for name, *_ in e2e.arm_order(["bfloat16"])] == ["cascade", "flat", "flat_2", "cascade_2"]
    monkeypatch.setenv("MLXCEL_MATMUL", "skinny")
    with e2e.matmul_env("cublas"):
        assert os.environ["MLXCEL_MATMUL"] == "cublas"
    with e2e.matmul_env("auto"):
        assert "MLXCEL_MATMUL" not in os.environ
    assert os.environ["MLXCEL_MATMUL"] == "skinny"


def test_the_e2e_token_check_scores_the_rows_where_arms_part():
    import gpu_e2e_bench as e2e
    base = [[5, 6, 7], [5, 6, 7], [1, 2, 3], [4, 4, 4], [9, 9, 9]]
    parted = [row[:] for row in base]
    parted[2][0], parted[3][2] = 8, 0            # row 2 parts at the first token, row 3 at the last
    check = e2e.agreement(base, parted)
    assert check == {"identical_rows": 3, "rows": 5, "steps_all_rows_agree": 0, "parted_rows": [2, 3]}
    report = {"cascade_vs_flat_tokens": e2e.agreement(base, base), "flat_vs_mlx_lm_tokens": check}
    assert e2e.scored_rows(report, 5) == [0, 1, 2, 3, 4]
    many = {"flat_vs_mlx_lm_tokens": {"parted_rows": list(range(2, 30))}}
    assert e2e.scored_rows(many, 32) == [0, 1, 2, 3, 4, 5, 31]       # the first PARTED_ROWS_SCORED parted rows


def test_the_step_profile_profiles_each_kv_page_format_on_any_device(tiny_model_path, tmp_path, monkeypatch):
    import json

    import gpu_step_profile as profile
    monkeypatch.setattr(sys, "argv", [
        "gpu_step_profile.py", "--out", str(tmp_path), "--model", str(tiny_model_path), "--sessions", "2",
        "--shared", "64", "--suffix", "8", "--new-tokens", "10", "--skip-steps", "2", "--profile-steps", "3",
        "--copy-mib", "4", "--kv-dtypes", "float32,int8"])
    profile.main()
    report = json.loads((tmp_path / "step_profile.json").read_text())
    arms = report["arms"]
    assert set(arms) == {"cascade", "flat", "cascade_int8", "flat_int8"}
    assert all(arm["steps"] > 0 and arm["host_ms"] > 0 for arm in arms.values())
    # Each arm ran on its own page format: an int8 page holds a token's head in D + 2 bytes, float32 in 4 D.
    assert arms["flat_int8"]["kv_bytes_per_step"] < 0.3 * arms["flat"]["kv_bytes_per_step"]
    assert arms["cascade_int8"]["kv_bytes_per_step"] < 0.3 * arms["cascade"]["kv_bytes_per_step"]
    assert set(report["arms_agree"]) == {"flat", "cascade_int8", "flat_int8"}
