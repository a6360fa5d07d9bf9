"""Hypothesis-generated requests against the app (in process, through
Starlette's TestClient) and a few against the real server: never a 5xx, never
a crash; refusals are OpenAI-style, and what is accepted completes well formed."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from reliability import assert_openai_error, assert_pool_at_baseline, check_stream, sse_events, wait_until
from serving import running_server
from starlette.testclient import TestClient

from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.limits import ServerLimits
from mlxcel.engine.server import OpenAIServer
from mlxcel.engine.builtin_models import TINY_MODEL_NAME

LIMITS = ServerLimits(max_prompt_tokens=32, max_body_bytes=4096, max_completion_tokens=4)
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# Any code point, lone UTF-16 surrogates included (json.dumps writes them as \ud800 escapes), and a few
# surrogates drawn often: lone ones, and a pair, which is one valid character once parsed.
surrogates = st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800", "\ud83d\ude00"])
def texts(min_size=0, max_size=12):
    return st.text(st.characters(exclude_categories=()), min_size=min_size, max_size=max_size) | surrogates


scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | texts())
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(texts(max_size=6), inner, max_size=4), max_leaves=8)


SAMPLING = {
    "model": st.just(TINY_MODEL_NAME),
    "max_tokens": st.integers(1, LIMITS.max_completion_tokens),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "seed": st.integers(0, 2**64 - 1),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "stop": st.text(min_size=1, max_size=3) | st.lists(st.text(min_size=1, max_size=3), min_size=1, max_size=4),
    "ignore_eos": st.booleans(),
    "top_k": st.integers(0, 50),
    "min_p": st.floats(0, 0.99),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0, 2),
    "repetition_context_size": st.integers(1, 64),
    "logit_bias": st.dictionaries(st.integers(0, 1023).map(str), st.floats(-100, 100), max_size=3),
}
def with_one_field_replaced(valid):
    """A valid body with one field (known or not) set to any JSON value."""
    fields = st.sampled_from(sorted(SAMPLING) + ["prompt", "messages", "model", "bogus"])
    return st.tuples(valid, fields, json_values).map(lambda t: t[0] | {t[1]: t[2]})


prompts = texts(min_size=1, max_size=30) | st.lists(st.integers(0, 1023), min_size=1,
                                                    max_size=LIMITS.max_prompt_tokens)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                           "content": texts(max_size=20)}), min_size=1, max_size=3)
completion = st.fixed_dictionaries({"prompt": prompts}, optional=SAMPLING)
chat = st.fixed_dictionaries({"messages": messages}, optional=SAMPLING)
control_values = {"enabled": st.booleans(), "min_shared_pages": st.integers(-1, 40),
                  "min_members": st.integers(-1, 6), "paused": st.booleans(), "add": st.integers(-1, 2),
                  "remove": st.integers(-1, 2)}
# Arbitrary keys too: the names of parameters ("self", "changes") once reached update(**body).
control_keys = texts(max_size=8) | st.sampled_from(sorted(control_values) + ["self", "changes", "name"])
control = (st.fixed_dictionaries({}, optional=control_values)
           | st.dictionaries(control_keys, scalars, max_size=3))
PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/cascade", "/v1/sessions", "/v1/engine", "/v1/models",
         "/metrics", "/health", "/nowhere"]
requests = st.one_of(
    st.tuples(st.just("/v1/completions"), completion | with_one_field_replaced(completion)),
    st.tuples(st.just("/v1/chat/completions"), chat | with_one_field_replaced(chat)),
    st.tuples(st.sampled_from(PATHS[2:5]), control | with_one_field_replaced(control)),
    st.tuples(st.sampled_from(PATHS), json_values | st.binary(max_size=120)),
).map(lambda t: (t[0], t[1] if isinstance(t[1], bytes) else json.dumps(t[1]).encode()))  # NaN, Infinity kept


def check_response(status: int, content_type: str, text: str) -> None:
    event(f"status {status}")
    assert status < 500, (status, text[:500])
    if status >= 400:
        error = json.loads(text)["error"]
        assert isinstance(error["message"], str) and error["message"] and "type" in error
    elif content_type.startswith("text/event-stream"):
        check_stream(sse_events(text.splitlines()))
    elif content_type.startswith("application/json"):
        reply = json.loads(text)
        if "choices" in reply:
            assert reply["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.fixture(scope="module")
def engine(tiny_loaded):
    engine = Engine(tiny_loaded, EngineConfig(num_blocks=32), cascade=CascadeConfig()).start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def app_client(engine):
    server = OpenAIServer(engine, TINY_MODEL_NAME, limits=LIMITS)
    with TestClient(server.app, base_url="http://localhost", raise_server_exceptions=True) as client:
        yield client


@settings(FUZZ, max_examples=150)
@given(request=requests, content_type=st.sampled_from(["application/json", "application/json; charset=utf-8",
                                                       "text/plain", ""]))
@example(request=("/v1/completions", b'{"model": "\\ud800", "prompt": "hi"}'), content_type="application/json")
@example(request=("/v1/chat/completions", b'{"model": "\\udfff"}'), content_type="application/json")
@example(request=("/v1/completions", b'{"prompt": "a\\ud800b"}'), content_type="application/json")
@example(request=("/v1/cascade", b'{"self": 1}'), content_type="application/json")
@example(request=("/v1/engine", b'{"\\ud800": 1}'), content_type="application/json")
def test_fuzzed_posts_never_fail_the_server(app_client, engine, request, content_type):
    path, body = request
    response = app_client.post(path, content=body, headers={"content-type": content_type} if content_type else {})
    check_response(response.status_code, response.headers.get("content-type", ""), response.text)
    engine.set_paused(False)  # a fuzzed {"paused": true} must not stall the next example


header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=24)


@settings(FUZZ, max_examples=60)
@given(request=requests, host=st.sampled_from(["localhost", "127.0.0.1:8000", "[::1]:80", "evil.example"])
       | header_text, origin=st.none() | st.sampled_from(["http://localhost", "http://evil.example", "null"])
       | header_text)
def test_fuzzed_hosts_and_origins_are_served_or_refused_cleanly(app_client, engine, request, host, origin):
    path, body = request
    headers = {"content-type": "application/json", "host": host} | ({"origin": origin} if origin else {})
    response = app_client.post(path, content=body, headers=headers)
    check_response(response.status_code, response.headers.get("content-type", ""), response.text)
    if origin and origin.lower() != f"http://{host}".lower():
        assert response.status_code == 403
    engine.set_paused(False)


@FUZZ
@given(path=st.sampled_from(PATHS + ["/v1"]), method=st.sampled_from(["GET", "PUT", "DELETE", "PATCH"]))
def test_other_methods_are_refused_cleanly(app_client, path, method):
    response = app_client.request(method, path)
    check_response(response.status_code, response.headers.get("content-type", ""), response.text)
    if method != "GET":
        assert_openai_error(response)


def test_pool_is_back_to_baseline_after_the_fuzzing(app_client, engine):
    assert wait_until(lambda: engine.pool.num_live == 0)
    assert_pool_at_baseline(engine)


@settings(FUZZ, max_examples=12)
@given(request=requests)
def test_fuzzed_posts_against_the_real_server(real_server, request):
    base, engine = real_server
    path, body = request
    response = httpx.post(base + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    check_response(response.status_code, response.headers.get("content-type", ""), response.text)
    engine.set_paused(False)  # a fuzzed {"paused": true} must not stall the next example


@pytest.fixture(scope="module")
def real_server(tiny_loaded):
    engine = Engine(tiny_loaded, EngineConfig(num_blocks=32), cascade=CascadeConfig())
    with running_server(engine, limits=LIMITS) as (base, server):
        yield base, engine
