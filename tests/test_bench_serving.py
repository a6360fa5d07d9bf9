"""The serving benchmark's own logic (arguments, percentiles, metric deltas,
tables, output agreement, workloads) and one tiny end-to-end run of it."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_serving_concurrency as bench  # noqa: E402
from serving_bench.agreement import compare_arms  # noqa: E402
from serving_bench.arm_run import ArmRun  # noqa: E402
from serving_bench.http_arm import read_chunk  # noqa: E402
from serving_bench.level_result import LevelResult  # noqa: E402
from serving_bench.report import ratio_lines, result_block, summary_table  # noqa: E402
from serving_bench.server_metrics import launch_split, parse_metrics  # noqa: E402
from serving_bench.stats import RequestRecord, median_summary, percentile, summarize  # noqa: E402
from serving_bench.workload import build_workload, common_prefix_length, level_variant  # noqa: E402

# -- arguments ----------------------------------------------------------------


def test_defaults_start_both_arms_and_scrape_metrics():
    args = bench.parse_args([])
    assert args.url is None and args.arms == ["on", "off"] and args.metrics
    assert (args.shared_prefix_tokens, args.concurrency, args.max_tokens, args.reps) == (2048, [4, 8, 16, 32], 128, 1)


def test_arguments_from_the_issue_parse():
    args = bench.parse_args(["--url", "http://127.0.0.1:9", "--shared-prefix-tokens", "512", "--prompt-tokens",
                             "16", "--concurrency", "16,4,8,4", "--max-tokens", "32", "--metrics",
                             "--compare-mlx-lm", "default", "--reps", "3"])
    assert args.concurrency == [4, 8, 16]  # sorted, deduplicated: levels ascend
    assert args.metrics and args.compare_mlx_lm == "default" and args.reps == 3


def test_a_url_run_scrapes_only_when_asked():
    assert not bench.parse_args(["--url", "http://127.0.0.1:9"]).metrics


@pytest.mark.parametrize("argv", [["--concurrency", "4,x"], ["--concurrency", "0"], ["--arms", "on,sideways"],
                                  ["--max-tokens", "0"], ["--reps", "0"], ["--kv-dtype", "int8,fp8"],
                                  ["--kv-dtype", ","], ["--url", "http://127.0.0.1:9", "--kv-dtype", "int8"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)


def test_server_arguments_per_arm():
    args = bench.parse_args(["--shared-prefix-tokens", "2048", "--concurrency", "8", "--max-tokens", "128",
                             "--min-shared-pages", "4"])
    # 2 x (65 shared pages + 8 clients x (6 private pages + 1))
    assert bench.pool_blocks(args) == 2 * (65 + 8 * 7)
    assert bench.server_args(args, "on")[:3] == ["--cascade", "--min-shared-pages", "4"]
    assert bench.server_args(args, "off")[0] == "--no-cascade" and "--min-shared-pages" not in bench.server_args(
        args, "off")


def test_every_arm_runs_on_each_kv_dtype():
    args = bench.parse_args(["--arms", "off,on", "--kv-dtype", "float32,int8,float32", "--concurrency", "8"])
    assert args.kv_dtype == ["float32", "int8"]
    assert bench.server_arms(args) == [("off", "float32"), ("off", "int8"), ("on", "float32"), ("on", "int8")]
    assert bench.server_args(args, "off", "int8")[:3] == ["--no-cascade", "--kv-dtype", "int8"]
    assert "--kv-dtype" not in bench.server_args(args, "off")
    assert bench.server_arms(bench.parse_args(["--arms", "off"])) == [("off", None)]


# -- statistics ---------------------------------------------------------------


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 100])
@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0], list(np.linspace(0, 7, 23))])
def test_percentile_matches_numpy(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_of_nothing_is_nan():
    assert math.isnan(percentile([], 50))


def record(index, ttft, latency, tokens, itl=(), error=None, cached=None):
    return RequestRecord(index, ttft=ttft, latency=latency, itl=list(itl), output_tokens=tokens, prompt_tokens=100,
                         cached_tokens=cached, error=error)


def test_summary_follows_vllm_definitions():
    records = [record(0, 1.0, 2.0, 11, itl=[0.1] * 10), record(1, 0.2, 1.2, 5, itl=[0.25] * 4),
               record(2, 0.5, 9.0, 3, error="boom")]
    s = summarize(records, duration=4.0)
    assert (s.requests, s.failed, s.output_tokens, s.input_tokens) == (2, 1, 16, 200)
    assert s.output_throughput == pytest.approx(4.0) and s.request_throughput == pytest.approx(0.5)
    assert s.total_token_throughput == pytest.approx(216 / 4)
    assert s.ttft_mean_ms == pytest.approx(600) and s.ttft_median_ms == pytest.approx(600)
    assert s.ttft_first_ms == pytest.approx(200) and s.ttft_rest_mean_ms == pytest.approx(1000)
    assert s.tpot_mean_ms == pytest.approx((100 + 250) / 2)  # (latency - ttft) / (tokens - 1)
    assert s.itl_mean_ms == pytest.approx((10 * 100 + 4 * 250) / 14)
    assert s.itl_p99_ms == pytest.approx(float(np.percentile([100] * 10 + [250] * 4, 99)))


def test_a_one_token_request_has_no_tpot():
    assert record(0, 0.1, 0.1, 1).tpot is None


def test_median_summary_is_field_wise():
    runs = [summarize([record(0, t, t + 1, 3)], duration=d) for t, d in ((0.1, 1.0), (0.3, 3.0), (0.2, 2.0))]
    middle = median_summary(runs)
    assert middle.ttft_mean_ms == pytest.approx(200) and middle.duration_s == pytest.approx(2.0)
    assert middle.requests == 1 and isinstance(middle.requests, int)


# -- server metrics -------------------------------------------------------------

BEFORE = """
mlxcel_paged_decode_launches_total{path="fused_v2"} 100
mlxcel_paged_decode_launches_total{path="gather"} 10
mlxcel_paged_decode_launches_total{path="cascade"} 40
mlxcel_cascade_shared_tokens_total 40960
mlxcel_cascade_member_sequences_total 160
mlxcel_cascade_failures_total 0
mlxcel_decode_step_seconds_count 25
mlxcel_decode_step_seconds_sum 1.5
mlxcel_prompt_cache_prefix_tokens_reused_total 2048
mlxcel_cache_pool_paged_blocks_live 7
"""

AFTER = """
mlxcel_paged_decode_launches_total{path="fused_v2"} 180
mlxcel_paged_decode_launches_total{path="gather"} 26
mlxcel_paged_decode_launches_total{path="cascade"} 100
mlxcel_cascade_shared_tokens_total 163840
mlxcel_cascade_member_sequences_total 580
mlxcel_cascade_failures_total 2
mlxcel_decode_step_seconds_count 35
mlxcel_decode_step_seconds_sum 2.5
mlxcel_prompt_cache_prefix_tokens_reused_total 16384
mlxcel_cache_pool_paged_blocks_live 90
"""


def test_launch_split_is_the_difference_of_two_scrapes():
    split = launch_split(parse_metrics(BEFORE), parse_metrics(AFTER))
    assert (split.fused_v2, split.gather, split.cascade, split.failures) == (80, 16, 60, 2)
    assert split.mean_shared_tokens == pytest.approx(2048) and split.mean_members == pytest.approx(7)
    assert split.cascade_share == pytest.approx(0.75)
    assert split.decode_steps == 10 and split.mean_decode_step_ms == pytest.approx(100)
    assert split.prefix_tokens_reused == 14336
    assert "mean shared 2048 tokens, mean members 7.0" in split.describe()


def test_a_level_without_cascade_says_so():
    split = launch_split(parse_metrics(BEFORE), parse_metrics(BEFORE.replace("100", "180")))
    assert split.cascade == 0 and math.isnan(split.mean_members)
    assert "did not run at this level" in split.describe()


def test_stream_chunks_fold_into_the_record():
    rec = RequestRecord(0)
    assert not read_chunk({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, rec)
    assert read_chunk({"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}, rec)
    assert read_chunk({"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "length"}]}, rec)
    assert not read_chunk({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4,
                                                    "prompt_tokens_details": {"cached_tokens": 32}}}, rec)
    assert (rec.text, rec.prompt_tokens, rec.output_tokens, rec.cached_tokens) == ("Hel", 9, 4, 32)


def test_a_chunk_with_only_a_token_id_still_counts_as_a_token():
    rec = RequestRecord(0)
    assert read_chunk({"choices": [{"index": 0, "delta": {"content": ""}, "token_ids": [2]}]}, rec)
    assert rec.token_ids == [2] and rec.text == ""


# -- reports --------------------------------------------------------------------


def arm_run(arm, concurrency, texts, ttft, tpot, decode_tps, kv=math.nan, peak=math.nan, rep=0):
    records = [record(i, ttft * (i + 1), ttft * (i + 1) + tpot * 9, 10, itl=[tpot] * 9) for i in range(concurrency)]
    for r, text in zip(records, texts):
        r.text = text
    return ArmRun(arm, concurrency, rep, 1, 2048, records, duration=5.0, decode_seconds=10.0,
                  decode_tokens=int(decode_tps * 10), peak_memory_bytes=peak, kv_peak_bytes=kv)


def three_arm_level(off_texts=("a", "b")):
    level = LevelResult(2)
    level.add(arm_run("cascade-on", 2, ["a", "b"], 0.1, 0.02, 300, kv=2**20, peak=2**28))
    level.add(arm_run("cascade-off", 2, list(off_texts), 0.1, 0.03, 200, kv=2**20, peak=2**28))
    level.add(arm_run("mlx-lm", 2, ["a", "b"], 0.5, 0.02, 250, kv=2**23, peak=2**29))
    return level


def test_ratios_name_the_targets():
    lines = ratio_lines([three_arm_level()])
    assert "concurrency 2: decode tok/s cascade-on / cascade-off = 1.50x  (target >= 1.5x: met)" in lines
    # clients 2..N: ours 200 ms, mlx-lm 1000 ms
    assert "concurrency 2: TTFT clients 2..N mlx-lm / cascade-on = 5.00x  (target >= 4x: met)" in lines
    assert "concurrency 2: KV memory mlx-lm / cascade-on = 8.00x  (target >= 4x: met)" in lines
    assert "concurrency 2: mean TPOT cascade-off / cascade-on = 1.50x" in lines


def kv_dtype_level(int8_decode_tps: float) -> LevelResult:
    """cascade-off on float32 and int8 pages (2**20 and 2**18 KV bytes at the peak)."""
    level = LevelResult(2)
    for kv_dtype, kv, decode in (("float32", 2**20, 200), ("int8", 2**18, int8_decode_tps)):
        run = arm_run(f"cascade-off+{kv_dtype}", 2, ["a", "b"], 0.1, 0.03, decode, kv=kv, peak=2**28)
        run.kv_dtype = kv_dtype
        level.add(run)
    return level


def test_kv_dtype_ratios_name_the_issue_targets():
    met = ratio_lines([kv_dtype_level(210)])
    assert met == ["concurrency 2: KV memory cascade-off+float32 / cascade-off+int8 = 4.00x  (target >= 3.5x: met)",
                   "concurrency 2: decode tok/s cascade-off+int8 / cascade-off+float32 = 1.05x  "
                   "(target >= 1x: met)",
                   "concurrency 2: output tok/s cascade-off+int8 / cascade-off+float32 = 1.00x"]
    assert "(target >= 1x: missed)" in ratio_lines([kv_dtype_level(190)])[1]
    assert "KV pages (the server's):                 int8" in result_block("x", kv_dtype_level(1).figures(
        "cascade-off+int8"))


def test_tables_carry_every_arm_and_the_vllm_labels():
    level = three_arm_level()
    table = summary_table([level])
    assert table.count("\n") == 1 + 3 and "| 2 | mlx-lm | 2 |" in table
    block = result_block("cascade-on @ concurrency 2", level.figures("cascade-on"))
    for label in ("Successful requests:", "Benchmark duration (s):", "Output token throughput (tok/s):",
                  "Mean TTFT (ms):", "P99 TPOT (ms):", "Median ITL (ms):", "KV memory at peak (MiB):"):
        assert label in block
    assert "Decode throughput (tok/s):               300.00" in block


def test_agreement_counts_identical_requests_and_shows_the_first_difference():
    same, = [a for a in compare_arms(three_arm_level()) if a.arm == "cascade-off"]
    assert same.all_identical and same.describe() == "cascade-off vs cascade-on: 2/2 identical by text"
    differs, = [a for a in compare_arms(three_arm_level(("a", "bx"))) if a.arm == "cascade-off"]
    assert (differs.identical, differs.compared) == (1, 2)
    assert "client 1, char 1: '' vs 'x'" in differs.describe()


def test_agreement_compares_token_ids_where_every_run_has_them():
    level = three_arm_level()
    for runs in level.runs.values():
        for run in runs:
            for r in run.records:
                r.token_ids = [7, r.index, 9]
    level.runs["cascade-off"][0].records[1].token_ids = [7, 1, 8]
    off, mlx = compare_arms(level)
    assert off.describe() == ("cascade-off vs cascade-on: 1/2 identical by token ids; 5/6 tokens (83%) before "
                              "the first difference; first difference at rep 0, client 1, token 2: (9,) vs (8,)")
    assert mlx.all_identical and mlx.by == "token ids"


# -- workloads --------------------------------------------------------------------


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[1, 2]]) == 2 and common_prefix_length([]) == 0


def test_workload_shares_the_system_prompt_and_differs_per_client(tiny_model_path):
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_path)
    workload = build_workload(tokenizer, shared_prefix_tokens=256, prompt_tokens=24, concurrency=4,
                              max_tokens=8, variant=3)
    systems = {r.messages[0]["content"] for r in workload.requests}
    questions = {r.messages[1]["content"] for r in workload.requests}
    assert len(systems) == 1 and len(questions) == 4
    assert 256 <= workload.shared_tokens <= 256 + 16
    assert all(len(r.token_ids) - workload.shared_tokens >= 20 for r in workload.requests)
    other = build_workload(tokenizer, shared_prefix_tokens=256, prompt_tokens=24, concurrency=4, max_tokens=8,
                           variant=4)
    assert common_prefix_length([workload.requests[0].token_ids, other.requests[0].token_ids]) < 32


def test_every_timed_run_gets_its_own_variant():
    variants = [level_variant(level, rep, reps=3) for level in range(3) for rep in range(3)]
    assert len(set(variants)) == 9 and 0 not in variants  # 0 is the warm-up's


# -- end to end -------------------------------------------------------------------


def test_a_tiny_run_starts_both_servers_and_compares_with_mlx_lm(tiny_model_path, tmp_path, capsys):
    """Not a timing test: the whole path runs, requests are complete, arms agree,
    and the launch split tells the cascade-on level from the cascade-off one."""
    levels = bench.main(["--shared-prefix-tokens", "64", "--prompt-tokens", "8", "--concurrency", "2",
                         "--max-tokens", "4", "--min-shared-pages", "1", "--model", "tiny", "--compare-mlx-lm", "tiny",
                         "--log-dir", str(tmp_path / "logs"), "--json", str(tmp_path / "runs.json")])
    out = capsys.readouterr().out
    level, = levels
    assert level.arms == ["cascade-on", "cascade-off", "mlx-lm"]
    for runs in level.runs.values():
        assert all(r.ok and r.output_tokens == 4 and len(r.token_ids) == 4 for r in runs[0].records)
    assert all(a.all_identical and a.by == "token ids" for a in compare_arms(level))
    assert any(len(set(r.token_ids)) > 1 for r in level.runs["mlx-lm"][0].records)
    on, off = level.runs["cascade-on"][0].launches, level.runs["cascade-off"][0].launches
    assert on.cascade > 0 and on.mean_members == 2 and off.cascade == 0
    assert level.runs["cascade-on"][0].records[1].cached_tokens >= 64
    assert level.figures("cascade-on").peak_memory_bytes > 0 and level.figures("mlx-lm").kv_peak_bytes > 0
    assert "=== cascade-on @ concurrency 2 ===" in out
    assert "| 2 | mlx-lm | 2 |" in out and "did not run at this level" in out
    assert (tmp_path / "runs.json").read_text().startswith("{")


def test_a_tiny_run_on_two_kv_dtypes_reports_their_memory_and_agreement(tiny_model_path, tmp_path, capsys):
    """Not a timing test: each server runs on the format asked for (as it reports it), the KV memory column
    prices a page at what it takes (the tiny model's int8 page: 64 codes + a 2-byte scale a token and head,
    float32's 256 bytes), and the agreement of the two formats' tokens is printed, not asserted."""
    levels = bench.main(["--shared-prefix-tokens", "64", "--prompt-tokens", "8", "--concurrency", "2",
                         "--max-tokens", "16", "--model", "tiny", "--arms", "off", "--kv-dtype", "float32,int8",
                         "--poll-interval", "0.01",
                         "--no-warmup", "--log-dir", str(tmp_path / "logs")])
    out = capsys.readouterr().out
    level, = levels
    assert level.arms == ["cascade-off+float32", "cascade-off+int8"]
    f32, int8 = level.figures("cascade-off+float32"), level.figures("cascade-off+int8")
    assert (f32.kv_dtype, int8.kv_dtype) == ("float32", "int8")
    for runs in level.runs.values():
        assert all(r.ok and r.output_tokens == 16 for r in runs[0].records)
    f32_blocks = f32.kv_peak_bytes / (2 * 4 * 32 * 2 * 256)
    assert f32_blocks >= 1 and f32_blocks == int(f32_blocks)
    assert int8.kv_peak_bytes / (2 * 4 * 32 * 2 * 66) == int(int8.kv_peak_bytes / (2 * 4 * 32 * 2 * 66)) >= 1
    assert "KV memory cascade-off+float32 / cascade-off+int8 = " in out and "(target >= 3.5x: " in out
    assert "cascade-off+int8 vs cascade-off+float32: " in out and "WARNING" not in out
