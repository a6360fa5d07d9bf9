"""/metrics as an operator reads it: every family typed and described, no
`_created` series, vLLM's request histograms filled by real requests, gauges
that agree with the snapshot, HTTP requests by route and status, the `_info`
gauge, process_* figures; and the access log that names no prompt or key."""

from __future__ import annotations

import logging
import threading

import httpx
import numpy as np
import openai
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from serving import running_server

from mlxcel.engine.builtin_models import TINY_MODEL_NAME
from mlxcel.engine.metrics import INTER_TOKEN_BUCKETS, BatchHistogram
from mlxcel.engine.sequence import SamplingParams

HISTOGRAMS = ("mlxcel_e2e_request_latency_seconds", "mlxcel_inter_token_latency_seconds",
              "mlxcel_request_queue_time_seconds", "mlxcel_request_prefill_time_seconds",
              "mlxcel_request_decode_time_seconds", "mlxcel_request_prompt_tokens",
              "mlxcel_request_generation_tokens", "mlxcel_request_ttft_seconds", "mlxcel_decode_step_seconds",
              "mlxcel_http_request_duration_seconds")
KEY = "metrics-test-key-0123456789abcdef"


def scrape(base) -> dict:
    text = httpx.get(f"{base}/metrics").text
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def value(families, name, suffix="", **labels):
    return sum(s.value for s in families[name].samples
               if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()))


def test_a_batch_histogram_exposes_what_prometheus_clients_histogram_does():
    # Random gaps in batches of a step's size, bounds hit exactly among them:
    # the same text, byte for byte, as one observe() per sample.
    gen = np.random.default_rng(0)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BatchHistogram("gaps_seconds", "Gaps", ours, INTER_TOKEN_BUCKETS)
    plain = Histogram("gaps_seconds", "Gaps", registry=theirs, buckets=INTER_TOKEN_BUCKETS)
    for _ in range(20):
        values = np.exp(gen.uniform(-9, 3, int(gen.integers(0, 33)))).tolist()
        values += gen.choice(INTER_TOKEN_BUCKETS, 2).tolist()
        batch.observe(values)
        for v in values:
            plain.observe(v)
    text = generate_latest(ours)
    assert text == generate_latest(theirs) and b'le="0.005"} 0' not in text   # every bucket filled


@pytest.fixture
def served(make_engine):
    engine = make_engine(num_blocks=64)
    with running_server(engine, api_key=KEY) as (base, server):
        yield base, engine, openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)


def test_every_family_is_typed_and_described_and_the_request_figures_fill(served, caplog):
    base, engine, client = served
    secret_prompt = "a prompt the log must never show"
    with caplog.at_level(logging.INFO, logger="mlxcel.server"):
        reply = client.completions.create(model=TINY_MODEL_NAME, prompt=secret_prompt, max_tokens=5,
                                          extra_body={"ignore_eos": True})
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=TINY_MODEL_NAME, prompt="x", max_tokens=2, extra_body={"bogus": 1})
        families, text = scrape(base)   # a request is logged just after its response is sent
    assert "_created" not in text
    for family in families.values():
        assert family.type in ("counter", "gauge", "histogram", "info", "summary"), family.name
        assert family.documentation.strip(), family.name
    for name in HISTOGRAMS:
        assert families[name].type == "histogram"
    assert value(families, "mlxcel_request_generation_tokens", "_sum") == reply.usage.completion_tokens == 5
    assert value(families, "mlxcel_request_prompt_tokens", "_sum") == reply.usage.prompt_tokens
    assert value(families, "mlxcel_inter_token_latency_seconds", "_count") == 4   # between 5 tokens
    for name in ("mlxcel_e2e_request_latency_seconds", "mlxcel_request_queue_time_seconds",
                 "mlxcel_request_prefill_time_seconds", "mlxcel_request_decode_time_seconds"):
        assert value(families, name, "_count") == 1, name
    e2e = value(families, "mlxcel_e2e_request_latency_seconds", "_sum")
    parts = sum(value(families, name, "_sum") for name in ("mlxcel_request_queue_time_seconds",
                                                           "mlxcel_request_prefill_time_seconds",
                                                           "mlxcel_request_decode_time_seconds"))
    assert 0 < parts <= e2e
    assert value(families, "mlxcel_completion_tokens", "_total") == 5
    assert value(families, "mlxcel_http_requests", "_total", method="POST", route="/v1/completions", status="200") == 1
    assert value(families, "mlxcel_http_requests", "_total", method="POST", route="/v1/completions", status="400") == 1
    info = families["mlxcel_engine_info"].samples[0].labels
    assert info["model"] == TINY_MODEL_NAME and info["num_blocks"] == "64" and info["block_size"] == "32"
    assert value(families, "process_resident_memory_bytes") > 0
    assert value(families, "mlxcel_cascade_kv_bytes_saved", "_total") == 0   # cascade off
    lines = [r.getMessage() for r in caplog.records if r.name == "mlxcel.server"]
    assert any(line.startswith("POST /v1/completions 200 prompt_tokens=") and "completion_tokens=5" in line
               for line in lines), lines
    assert any(line.startswith("POST /v1/completions 400") for line in lines), lines
    assert not any(secret_prompt in line or KEY in line for line in lines)


def test_running_waiting_and_kv_usage_agree_with_the_snapshot(served):
    base, engine, client = served
    engine.set_paused(True)
    # Three that fit and run together once resumed; while paused they wait, or hold pages once admitted.
    seqs = [engine.submit([5 + i] * 40, SamplingParams(max_tokens=200, ignore_eos=True)) for i in range(3)]
    engine.set_paused(False)
    seen = threading.Event()

    def stop_when_running():
        while not seen.is_set():
            snap = engine.snapshot
            if snap.running == 3:
                engine.set_paused(True)
                seen.set()

    watcher = threading.Thread(target=stop_when_running, daemon=True)
    watcher.start()
    assert seen.wait(30)
    watcher.join()
    families, _ = scrape(base)
    snap = engine.snapshot
    assert value(families, "mlxcel_running_sequences") == snap.running == len(snap.sequences) == 3
    assert value(families, "mlxcel_queue_depth") == snap.waiting == 0
    usage = value(families, "mlxcel_kv_cache_usage_ratio")
    assert usage == snap.pool.live / snap.pool.num_blocks and 0 < usage <= 1
    for seq in seqs:
        engine.cancel(seq)
    engine.set_paused(False)


def test_periodic_engine_summary(make_engine, caplog):
    from mlxcel.engine.stat_logger import StatLogger

    engine = make_engine()
    logger = StatLogger(engine, interval=0)
    with caplog.at_level(logging.INFO, logger="mlxcel.stats"):
        logger.tick()   # idle: nothing to say
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))
        logger.tick()
    lines = [r.getMessage() for r in caplog.records if r.name == "mlxcel.stats"]
    assert len(lines) == 1 and "generation throughput" in lines[0] and "running: 0 reqs" in lines[0]


def test_the_pool_is_logged_once_at_start(make_engine, caplog):
    with caplog.at_level(logging.INFO, logger="mlxcel.stats"):
        make_engine(num_blocks=16, kv_dtype="int8")
    lines = [r.getMessage() for r in caplog.records if r.name == "mlxcel.stats"]
    # 2 x 4 layers x 32 tokens x 2 heads x (64 codes + a 2-byte scale) = 33 KiB; 256 / 66 = 3.88.
    assert lines == ["KV cache: 16 blocks of 32 tokens, int8 pages of 33.0 KiB (3.88x the pages of float32), "
                     "0.5 MiB"]


def test_the_grafana_dashboard_queries_only_exported_series(served):
    import json
    import re
    from pathlib import Path

    base, engine, client = served
    client.completions.create(model=TINY_MODEL_NAME, prompt="hi", max_tokens=2)
    _, text = scrape(base)
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    dashboard = json.loads((Path(__file__).parents[1] / "docs/grafana/mlxcel.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    names = {n for e in exprs for n in re.findall(r"\b(?:mlxcel|process)_[a-z0-9_]+", e)}
    assert len(exprs) >= 20 and len(names) >= 25
    assert names <= exported, sorted(names - exported)


@pytest.mark.parametrize("max_tokens", [1, 5])
def test_a_request_is_counted_before_its_last_event_goes_out(make_engine, max_tokens):
    """A client that scrapes /metrics as soon as its answer ends must find the request counted: the engine
    counts a finished request before it hands out the last event (which carries the last token)."""
    engine = make_engine()
    seen = []

    def on_event(seq, token, reason):
        if reason is not None:
            seen.append((token, reason, engine.metrics.registry.get_sample_value(
                "mlxcel_requests_total", {"finish_reason": reason})))

    engine.submit([5, 6, 7, 8], SamplingParams(max_tokens=max_tokens, ignore_eos=True), on_event=on_event)
    engine.run_until_idle()
    assert len(seen) == 1
    token, reason, counted = seen[0]
    assert token is not None and reason == "length" and counted == 1


@pytest.mark.parametrize("kv_dtype, token_bytes", [(None, 4 * 64), ("int8", 64 + 2), ("int4", 32 + 2 * 2 * 2)])
def test_the_page_format_its_bytes_and_the_pages_it_gains(make_engine, kv_dtype, token_bytes):
    """The tiny model (4 layers, 2 KV heads 64 wide, float32): a page of 32
    tokens is 2 x 4 x 32 x 2 x the bytes of one token and head (int8: codes
    and a float16 scale; int4: half-byte codes, a float16 scale and zero per
    32 channels)."""
    engine = make_engine(num_blocks=16, kv_dtype=kv_dtype)
    with running_server(engine) as (base, _):
        families, text = scrape(base)
        pool = httpx.get(f"{base}/v1/cascade").json()["snapshot"]["pool"]   # what `attach` reads
    page = 2 * 4 * 32 * 2 * token_bytes
    assert (pool["kv_dtype"], pool["bytes_per_block"]) == (kv_dtype or "float32", page)
    assert (pool["model_dtype"], pool["model_dtype_bytes_per_block"]) == ("float32", 2 * 4 * 32 * 2 * 4 * 64)
    assert value(families, "mlxcel_kv_cache_page_bytes") == page
    assert value(families, "mlxcel_kv_cache_pages_vs_model_dtype_ratio") == pytest.approx(4 * 64 / token_bytes)
    for name in ("mlxcel_kv_cache_page_bytes", "mlxcel_kv_cache_pages_vs_model_dtype_ratio"):
        assert families[name].type == "gauge" and families[name].documentation
    info = families["mlxcel_engine_info"].samples[0].labels
    assert info["kv_dtype"] == (kv_dtype or "float32") and info["dtype"] == "float32"
    assert info["kv_cache_bytes"] == str(16 * page)
