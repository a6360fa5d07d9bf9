"""A client that goes away mid-request: its sequence is cancelled within one
engine step and its pages are released, while the prefix pages it shared keep
their other holder."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading

import httpx
import pytest
from reliability import assert_pool_at_baseline, wait_until
from serving import running_server

from mlxcel.engine.server import OpenAIServer

BLOCK = 32
PREFIX = [(7 * i) % 1000 + 3 for i in range(3 * BLOCK + 5)]  # three full shared pages and a bit


class Recorder:
    """Which sequences the server submitted, when it cancelled them, and what each released."""

    def __init__(self, engine, monkeypatch) -> None:
        self.engine = engine
        self.seqs, self.cancelled_at, self.finished_at, self.released = [], {}, {}, {}
        submit, cancel, release = engine.submit, engine.cancel, engine.cache.release

        def on_submit(ids, params, on_event, label=""):
            def relay(seq, token, reason):
                if reason is not None:
                    self.finished_at[seq.id] = (engine.step_count, reason)
                on_event(seq, token, reason)

            seq = submit(ids, params, relay, label)
            self.seqs.append(seq)
            return seq

        def on_cancel(seq, reason="cancelled"):
            self.cancelled_at.setdefault(seq.id, engine.step_count)
            cancel(seq, reason)

        def on_release(seq):
            self.released.setdefault(seq.id, list(seq.block_table))
            release(seq)

        monkeypatch.setattr(engine, "submit", on_submit)
        monkeypatch.setattr(engine, "cancel", on_cancel)
        monkeypatch.setattr(engine.cache, "release", on_release)


def stream_lines(base, body, lines, until: threading.Event):
    """Read a stream into `lines` until `until` is set, then hang up."""
    with httpx.Client(base_url=base, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            for line in response.iter_lines():
                lines.append(line)
                if until.is_set():
                    return


@pytest.fixture
def served(make_engine, monkeypatch):
    engine = make_engine(num_blocks=64)
    recorder = Recorder(engine, monkeypatch)
    with running_server(engine) as (base, server):
        yield base, engine, recorder


def test_stream_disconnect_cancels_within_a_step_and_keeps_shared_pages(served):
    base, engine, rec = served
    keeper_lines, leaver_lines, stop_keeper = [], [], threading.Event()
    keeper_body = {"prompt": PREFIX + [11, 12], "max_tokens": 400, "ignore_eos": True, "temperature": 0,
                   "stream": True}
    keeper = threading.Thread(target=stream_lines, args=(base, keeper_body, keeper_lines, stop_keeper))
    keeper.start()
    assert wait_until(lambda: len(keeper_lines) >= 2)
    a = rec.seqs[0]

    with httpx.Client(base_url=base, timeout=30) as client:
        body = {"prompt": PREFIX + [21, 22, 23], "max_tokens": 400, "ignore_eos": True, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            while len([line for line in leaver_lines if line]) < 3:
                leaver_lines.append(next(lines))
            b = rec.seqs[1]
            shared = [blk for blk in b.block_table if blk in a.block_table]
            assert len(shared) >= 3 and all(engine.pool.refcount[blk] == 2 for blk in shared)
        # leaving the block closes the connection mid-stream

    assert wait_until(lambda: b.id in rec.finished_at)
    step, reason = rec.finished_at[b.id]
    assert reason == "cancelled"
    assert step - rec.cancelled_at[b.id] <= 1, "the sequence outlived its cancel by more than one step"
    assert not a.is_finished, "the other session must still be running"
    released = rec.released[b.id]
    private = [blk for blk in released if blk not in a.block_table]
    assert private, "the leaver held pages of its own"
    assert all(engine.pool.refcount[blk] == 1 for blk in released if blk in a.block_table)
    assert all(engine.pool.refcount[blk] == 0 for blk in private)
    assert engine.pool.num_live == len(a.block_table)

    stop_keeper.set()
    keeper.join(30)
    assert wait_until(lambda: a.is_finished)
    assert a.finish_reason == "cancelled"
    assert_pool_at_baseline(engine)


def test_non_streaming_client_that_times_out_is_cancelled(served):
    base, engine, rec = served
    body = {"prompt": PREFIX, "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base}/v1/completions", json=body, timeout=0.5)
    assert wait_until(lambda: rec.seqs and rec.seqs[0].id in rec.finished_at)
    seq = rec.seqs[0]
    step, reason = rec.finished_at[seq.id]
    assert reason == "cancelled" and step - rec.cancelled_at[seq.id] <= 1
    assert seq.num_completion_tokens < 400
    assert wait_until(lambda: engine.pool.num_live == 0)
    assert_pool_at_baseline(engine)


def test_disconnect_while_paused_still_releases_pages(served):
    base, engine, rec = served
    engine.set_paused(True)
    body = {"prompt": PREFIX, "max_tokens": 8, "stream": True}
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=0.5) as response:
            list(response.iter_lines())
    assert wait_until(lambda: rec.seqs and rec.seqs[0].id in rec.finished_at)
    assert rec.finished_at[rec.seqs[0].id][1] == "cancelled"
    assert engine.paused and not engine.scheduler.has_work
    assert_pool_at_baseline(engine)


@pytest.mark.parametrize("stream", [True, False])
def test_client_gone_before_the_response_starts_is_cancelled(make_engine, monkeypatch, stream):
    """The client is gone before the body is first iterated: for a stream the
    write of the headers fails, for a plain request the disconnect is already
    waiting. The sequence is cancelled all the same, not run to max_tokens."""
    engine = make_engine(num_blocks=64).start()
    rec = Recorder(engine, monkeypatch)
    server = OpenAIServer(engine, engine.loaded.name)
    body = json.dumps({"prompt": PREFIX, "max_tokens": 400, "ignore_eos": True, "stream": stream}).encode()
    sent = []

    async def receive():
        if not sent:
            sent.append(body)
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message):
        if stream:
            raise OSError("the client is gone")  # as a socket write to a closed connection does

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [
        (b"content-type", b"application/json")], "query_string": b"", "asgi": {"spec_version": "2.3"},
        "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}
    with pytest.raises(OSError) if stream else contextlib.nullcontext():
        asyncio.run(server.app(scope, receive, send))
    assert wait_until(lambda: rec.seqs and rec.seqs[0].is_finished)
    seq = rec.seqs[0]
    assert seq.finish_reason == "cancelled" and seq.num_completion_tokens < 400
    assert wait_until(lambda: engine.pool.num_live == 0)
    assert_pool_at_baseline(engine)
