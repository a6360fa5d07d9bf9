"""A request's finish reason is the same in its reply and in
mlxcel_requests_total: a stop string counts as "stop", not as a cancel."""

from __future__ import annotations

import httpx
from reliability import wait_until
from serving import running_server

BODY = {"prompt": [9, 10, 11, 12], "max_tokens": 12, "temperature": 0, "ignore_eos": True}


def finished(engine, reason):
    return engine.metrics.registry.get_sample_value("mlxcel_requests_total", {"finish_reason": reason}) or 0


def test_stop_string_is_a_stop_in_the_reply_and_the_metrics(make_engine):
    engine = make_engine(num_blocks=16)
    with running_server(engine) as (base, server):
        whole = httpx.post(f"{base}/v1/completions", json=BODY, timeout=30).json()["choices"][0]["text"]
        stop = whole[len(whole) // 2:][:2]
        assert stop.strip(), whole
        # Far more tokens than the stop needs, so the engine cannot end it by length first.
        long = BODY | {"stop": stop, "max_tokens": 400}
        reply = httpx.post(f"{base}/v1/completions", json=long, timeout=30).json()["choices"][0]
        assert reply["finish_reason"] == "stop" and reply["text"] == whole[:whole.index(stop)]
        assert wait_until(lambda: engine.pool.num_live == 0)
    assert (finished(engine, "length"), finished(engine, "stop"), finished(engine, "cancelled")) == (1, 1, 0)
