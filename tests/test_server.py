"""The server driven by the real openai client and by raw HTTP."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import running_server

from mlxcel.engine.builtin_models import TINY_MODEL_NAME
from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS
from mlxcel_tui.source import samples_dict

SYSTEM = ("You are the shared system prompt of a serving-engine test. Every client sends these words "
          "first, so the engine keeps one copy of their pages and attends to them once per step. ") * 3


def launches(base, path):
    text = httpx.get(f"{base}/metrics").text
    return samples_dict(text_string_to_metric_families(text)).get(
        f'mlxcel_paged_decode_launches_total{{path="{path}"}}', 0)


@pytest.fixture
def served(make_engine):
    engine = make_engine(enabled=True, min_shared_pages=2)
    with running_server(engine) as (base, server):
        yield base, engine, openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(served):
    base, engine, client = served
    assert [m.id for m in client.models.list().data] == [TINY_MODEL_NAME]


def test_chat_completion_non_streaming(served):
    base, engine, client = served
    reply = client.chat.completions.create(
        model=TINY_MODEL_NAME, max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": DEFAULT_QUESTIONS[0]}])
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert isinstance(choice.message.content, str)
    assert 1 <= reply.usage.completion_tokens <= 8
    assert reply.usage.prompt_tokens > 50


def test_chat_streaming_matches_non_streaming(served):
    base, engine, client = served
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": DEFAULT_QUESTIONS[1]}]
    whole = client.chat.completions.create(model=TINY_MODEL_NAME, max_tokens=10, temperature=0,
                                           messages=messages)
    stream = client.chat.completions.create(model=TINY_MODEL_NAME, max_tokens=10, temperature=0,
                                            messages=messages, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == whole.choices[0].message.content
    assert reasons == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # The second request with this system prompt reused its cached pages.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 64


def test_completions_streaming_and_not(served):
    base, engine, client = served
    whole = client.completions.create(model=TINY_MODEL_NAME, prompt="The pool", max_tokens=6, temperature=0)
    parts = list(client.completions.create(model=TINY_MODEL_NAME, prompt="The pool", max_tokens=6,
                                           temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text
    assert whole.usage.completion_tokens <= 6


def test_raw_http_sse_framing(served):
    base, engine, client = served
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


def test_return_token_ids_streams_one_chunk_per_token(served):
    base, engine, client = served
    body = {"messages": [{"role": "user", "content": DEFAULT_QUESTIONS[2]}], "max_tokens": 12, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    whole = httpx.post(f"{base}/v1/chat/completions", json=body).json()
    with httpx.stream("POST", f"{base}/v1/chat/completions", json={**body, "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    ids = [c["choices"][0]["token_ids"] for c in chunks[1:]]  # after the chunk naming the role
    assert ids == [[t] for t in whole["choices"][0]["token_ids"]] and len(ids) == 12
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == whole["choices"][0]["message"]["content"]
    bad = httpx.post(f"{base}/v1/chat/completions", json={**body, "return_token_ids": "yes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "return_token_ids"


def test_concurrent_clients_sharing_a_prompt_cascade_and_cascade_off_stays_flat(served):
    base, engine, client = served

    def ask(question):
        return client.chat.completions.create(
            model=TINY_MODEL_NAME, max_tokens=12, temperature=0,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            extra_body={"ignore_eos": True})

    before = launches(base, "cascade")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(ask, DEFAULT_QUESTIONS[:4]))
    assert all(r.usage.completion_tokens == 12 for r in replies)
    during_on = launches(base, "cascade")
    assert during_on > before

    assert httpx.post(f"{base}/v1/cascade", json={"enabled": False}).json()["config"]["enabled"] is False
    flat_before = launches(base, "fused_v2")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(ask, DEFAULT_QUESTIONS[4:8]))
    assert launches(base, "cascade") == during_on
    assert launches(base, "fused_v2") > flat_before


def test_control_api_validates_and_keeps_old_values(served):
    base, engine, client = served
    good = httpx.post(f"{base}/v1/cascade", json={"min_shared_pages": 4, "min_members": 3})
    assert good.status_code == 200 and good.json()["config"]["min_shared_pages"] == 4
    for bad in ({"min_shared_pages": 0}, {"min_members": "two"}, {"enabled": "maybe"}, {"bogus": 1}):
        response = httpx.post(f"{base}/v1/cascade", json=bad)
        assert response.status_code == 400
        assert response.json()["error"]["message"]
    config = httpx.get(f"{base}/v1/cascade").json()["config"]
    assert config == {"enabled": True, "min_shared_pages": 4, "min_members": 3}
    assert "sequences" in httpx.get(f"{base}/v1/cascade").json()["snapshot"]


def test_a_snapshot_waiting_for_the_engine_holds_up_no_other_request(served):
    # /v1/cascade reads the engine's snapshot under its state lock (held while a step is built): the wait
    # happens off the event loop, so the server answers other requests meanwhile.
    base, engine, client = served
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with engine._state:
            waiting = pool.submit(httpx.get, f"{base}/v1/cascade", timeout=30)
            time.sleep(0.5)   # the request reaches its handler, which waits
            models = httpx.get(f"{base}/v1/models", timeout=5)
            assert models.status_code == 200 and not waiting.done()
        assert waiting.result(timeout=30).json()["snapshot"]["sequences"] == []


def test_metrics_is_prometheus_text(served):
    base, engine, client = served
    client.completions.create(model=TINY_MODEL_NAME, prompt="hi", max_tokens=2)
    response = httpx.get(f"{base}/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    samples = samples_dict(text_string_to_metric_families(response.text))
    assert samples.get('mlxcel_requests_total{finish_reason="length"}', 0) + samples.get(
        'mlxcel_requests_total{finish_reason="stop"}', 0) >= 1
    assert samples["mlxcel_cache_pool_paged_blocks_allocated"] == engine.pool.num_blocks
    assert samples["mlxcel_prompt_cache_queries_total"] >= 1
    assert samples["mlxcel_decode_step_seconds_count"] >= 1
