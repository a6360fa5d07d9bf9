"""Bad HTTP requests get a 4xx with an OpenAI-style body, and nothing else
changes: a good stream running alongside completes, and the pool returns to
its baseline."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import threading

import httpx
import pytest
from reliability import assert_openai_error, assert_pool_at_baseline, check_stream, sse_events, wait_until
from serving import running_server

from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.limits import ServerLimits
from mlxcel.engine.builtin_models import TINY_MODEL_NAME

LIMITS = ServerLimits(max_prompt_tokens=48, max_body_bytes=16384, max_completion_tokens=64)
POOL_BLOCKS = 3  # 96 tokens: a 48-token prompt asking for 64 more can never fit
GOOD_BODY = {"prompt": [7, 8, 9, 10], "max_tokens": 64, "ignore_eos": True, "temperature": 0, "stream": True}
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def served(tiny_loaded):
    engine = Engine(tiny_loaded, EngineConfig(num_blocks=POOL_BLOCKS), cascade=CascadeConfig())
    with running_server(engine, limits=LIMITS) as (base, server):
        with httpx.Client(base_url=base, timeout=30) as client:
            yield client, engine
    engine.stop()


class GoodStream:
    """A streaming completion started before the bad request and read to its end."""

    def __init__(self, client: httpx.Client) -> None:
        self.started = threading.Event()
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._run, args=(client,))
        self.thread.start()
        assert self.started.wait(30), "the good stream never started"

    def _run(self, client) -> None:
        with client.stream("POST", "/v1/completions", json=GOOD_BODY) as response:
            for line in response.iter_lines():
                self.lines.append(line)
                self.started.set()

    def finish(self) -> list:
        self.thread.join(30)
        return sse_events(self.lines)


def body(**fields) -> dict:
    return {"prompt": "hello", "max_tokens": 4} | fields


def chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4} | fields


# (request kwargs for client.request, expected status, expected param)
BAD_REQUESTS = {
    "malformed json": (dict(content=b'{"prompt": "hi",', headers=JSON), 400, None),
    "body not an object": (dict(content=b"[1, 2]", headers=JSON), 400, None),
    "invalid utf-8": (dict(content=b'{"prompt": "\xff\xfe"}', headers=JSON), 400, None),
    "deep nesting": (dict(content=b"[" * 5000 + b"]" * 5000, headers=JSON), 400, None),
    "over-long integer": (dict(content=b'{"max_tokens": 1' + b"0" * 5000 + b"}", headers=JSON), 400, None),
    "empty body": (dict(content=b"", headers=JSON), 400, None),
    "body over the byte limit": (dict(json=body(prompt="x" * 20000)), 413, None),
    "unknown model": (dict(json=body(model="gpt-4")), 404, "model"),
    "model named by a path": (dict(json=body(model="/etc/passwd")), 404, "model"),
    "prompt of the wrong type": (dict(json=body(prompt=5)), 400, "prompt"),
    "prompt of mixed ids": (dict(json=body(prompt=[1, "a"])), 400, "prompt"),
    "prompt of booleans": (dict(json=body(prompt=[True, False])), 400, "prompt"),
    "two prompts": (dict(json=body(prompt=["a", "b"])), 400, "prompt"),
    "empty prompt": (dict(json=body(prompt="")), 400, "prompt"),
    "empty id list": (dict(json=body(prompt=[])), 400, "prompt"),
    "ids beyond the vocabulary": (dict(json=body(prompt=[1, 1024])), 400, "prompt"),
    "negative id": (dict(json=body(prompt=[-1])), 400, "prompt"),
    "prompt over the token limit": (dict(json=body(prompt=[5] * 49)), 400, "prompt"),
    "chat over the token limit": (dict(url="/v1/chat/completions",
                                       json=chat(messages=[{"role": "user", "content": "word " * 60}])),
                                  400, "prompt"),
    "messages not a list": (dict(url="/v1/chat/completions", json=chat(messages="hi")), 400, "messages"),
    "no messages": (dict(url="/v1/chat/completions", json=chat(messages=[])), 400, "messages"),
    "message content not a string": (dict(url="/v1/chat/completions",
                                          json=chat(messages=[{"role": "user", "content": 3}])), 400, "messages"),
    "max_tokens zero": (dict(json=body(max_tokens=0)), 400, "max_tokens"),
    "max_tokens negative": (dict(json=body(max_tokens=-1)), 400, "max_tokens"),
    "max_tokens over the limit": (dict(json=body(max_tokens=65)), 400, "max_tokens"),
    "max_tokens huge": (dict(json=body(max_tokens=10**30)), 400, "max_tokens"),
    "max_tokens a string": (dict(json=body(max_tokens="8")), 400, "max_tokens"),
    "max_tokens a float": (dict(json=body(max_tokens=4.0)), 400, "max_tokens"),
    "max_completion_tokens over": (dict(url="/v1/chat/completions", json=chat(max_completion_tokens=99)),
                                   400, "max_tokens"),
    "never fits the pool": (dict(json=body(prompt=[5] * 48, max_tokens=64)), 400, "max_tokens"),
    "temperature negative": (dict(json=body(temperature=-0.1)), 400, "temperature"),
    "temperature too high": (dict(json=body(temperature=2.5)), 400, "temperature"),
    "temperature NaN": (dict(content=b'{"prompt": "hi", "temperature": NaN}', headers=JSON), 400, "temperature"),
    "temperature a string": (dict(json=body(temperature="hot")), 400, "temperature"),
    "top_p over one": (dict(json=body(top_p=1.5)), 400, "top_p"),
    "top_p Infinity": (dict(content=b'{"prompt": "hi", "top_p": -Infinity}', headers=JSON), 400, "top_p"),
    "seed negative": (dict(json=body(seed=-1)), 400, "seed"),
    "seed over 64 bits": (dict(json=body(seed=2**64)), 400, "seed"),
    "seed a float": (dict(json=body(seed=1.5)), 400, "seed"),
    "n above one": (dict(json=body(n=2)), 400, "n"),
    "stream not a boolean": (dict(json=body(stream="yes")), 400, "stream"),
    "stop of the wrong type": (dict(json=body(stop=5)), 400, "stop"),
    "too many stops": (dict(json=body(stop=["a", "b", "c", "d", "e"])), 400, "stop"),
    "empty stop": (dict(json=body(stop=[""])), 400, "stop"),
    "ignore_eos not a boolean": (dict(json=body(ignore_eos="no")), 400, "ignore_eos"),
    "unknown route": (dict(url="/v1/embeddings", json={}), 404, None),
    "wrong method": (dict(method="GET", url="/v1/completions"), 405, None),
    "lone surrogate as the model": (dict(content=b'{"model": "\\ud800", "prompt": "hi"}', headers=JSON), 400, None),
    "lone surrogate as the chat model": (dict(url="/v1/chat/completions", headers=JSON,
                                              content=b'{"model": "\\udfff", "messages": []}'), 400, None),
    "lone surrogate in the prompt": (dict(content=b'{"prompt": "a\\ud800b"}', headers=JSON), 400, None),
    "lone surrogate in a message": (dict(url="/v1/chat/completions", headers=JSON, content=b'{"messages": '
                                         b'[{"role": "user", "content": "\\udc00\\ud800"}]}'), 400, None),
    "lone surrogate as a key": (dict(content=b'{"\\uD800x": 1, "prompt": "hi"}', headers=JSON), 400, None),
    "text/plain body": (dict(content=b'{"prompt": "hi"}', headers={"content-type": "text/plain"}), 415, None),
    "form body": (dict(data={"prompt": "hi"}), 415, None),
    "no content type": (dict(content=b'{"prompt": "hi"}'), 415, None),
    "prompt over the character bound": (dict(json=body(prompt="x" * 5000)), 400, "prompt"),
    "messages over the character bound": (dict(url="/v1/chat/completions",
                                               json=chat(messages=[{"role": "user", "content": "y" * 5000}])),
                                          400, "prompt"),
}


def send(client, kwargs):
    return client.request(**({"method": "POST", "url": "/v1/completions"} | kwargs))


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_request_gets_an_openai_error_and_queues_nothing(served, name, monkeypatch):
    client, engine = served
    kwargs, status, param = BAD_REQUESTS[name]
    queued, submit = [], engine.submit
    monkeypatch.setattr(engine, "submit", lambda *args, **kw: queued.append(submit(*args, **kw)))
    error = assert_openai_error(send(client, kwargs), status)
    if param is not None:
        assert error["param"] == param, error
    assert queued == []
    assert_pool_at_baseline(engine)


def test_bad_requests_leave_a_concurrent_stream_untouched(served):
    client, engine = served
    good = GoodStream(client)

    def refuse(case) -> bool:
        kwargs, status, _ = case
        assert_openai_error(send(client, kwargs), status)
        return good.thread.is_alive()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        overlapped = list(pool.map(refuse, BAD_REQUESTS.values()))
    assert any(overlapped), "no bad request was answered while the good stream ran"
    text = check_stream(good.finish(), finish_reasons=("length",))
    alone = client.post("/v1/completions", json=GOOD_BODY | {"stream": False}).json()
    assert text == alone["choices"][0]["text"]
    assert wait_until(lambda: engine.pool.num_live == 0)
    assert_pool_at_baseline(engine)


def test_a_surrogate_pair_is_one_character_and_fine(served):
    client, engine = served
    reply = client.post("/v1/completions", content=b'{"prompt": "a \\ud83d\\ude00", "max_tokens": 2}', headers=JSON)
    assert reply.status_code == 200, reply.text


def test_a_prompt_longer_than_the_pool_is_refused_naming_the_prompt(make_engine):
    engine = make_engine(num_blocks=1)  # 32 tokens
    with running_server(engine, limits=LIMITS) as (base, server):
        error = assert_openai_error(httpx.post(f"{base}/v1/completions", json=body(prompt=[5] * 40)), 400)
        assert error["param"] == "prompt" and "40 tokens" in error["message"] and "32" in error["message"]
        error = assert_openai_error(httpx.post(f"{base}/v1/completions", json=body(prompt=[5] * 30)), 400)
        assert error["param"] == "max_tokens"  # the prompt fits; with its 4 tokens to generate it does not
        assert_pool_at_baseline(engine)


def test_the_model_name_is_accepted(served):
    client, engine = served
    reply = client.post("/v1/completions", json=body(model=TINY_MODEL_NAME))
    assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_declared_length_over_the_limit_is_refused_before_reading(served):
    client, engine = served
    conn = http.client.HTTPConnection(client.base_url.host, client.base_url.port, timeout=10)
    conn.putrequest("POST", "/v1/completions")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", "999999")  # and only two bytes follow
    conn.endheaders(b"{}")
    reply = conn.getresponse()
    assert reply.status == 413
    error = json.loads(reply.read())["error"]
    assert error["message"] == f"request body over {LIMITS.max_body_bytes} bytes"
    conn.close()


def test_a_request_without_max_tokens_stays_within_the_limit(served):
    client, engine = served
    reply = client.post("/v1/completions", json={"prompt": [5, 6], "ignore_eos": True, "temperature": 0})
    assert reply.status_code == 200
    assert reply.json()["usage"]["completion_tokens"] == LIMITS.max_completion_tokens
