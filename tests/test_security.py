"""Loopback by default, an API key required beyond it, a bearer token on every
endpoint but /metrics when a key is set, and no endpoint touching files a
client names."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import httpx
import pytest
from cli_process import ServeProcess, cli_env
from reliability import assert_openai_error
from serving import running_server

from mlxcel.engine import model as model_module
from mlxcel.engine.listen import check_bind
from mlxcel_tui import cli

KEY = "s3cret-key"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost"])
def test_loopback_needs_no_key(host):
    check_bind(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "10.0.0.1", "example.com", ""])
def test_beyond_loopback_needs_a_key(host):
    with pytest.raises(ValueError, match="without an API key"):
        check_bind(host, None)
    with pytest.raises(ValueError):
        check_bind(host, "")
    check_bind(host, KEY)


def test_serve_binds_loopback_by_default():
    host = next(p for p in cli.serve.params if p.name == "host")
    assert host.default == "127.0.0.1"
    api_key = next(p for p in cli.serve.params if p.name == "api_key")
    assert api_key.envvar == "MLXCEL_API_KEY"


# -- the bearer token ---------------------------------------------------------

GOOD_BODIES = {
    "/v1/completions": {"prompt": "hi", "max_tokens": 1},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    "/v1/cascade": {},
    "/v1/sessions": {},
    "/v1/engine": {"paused": False},
}


@pytest.fixture(scope="module")
def keyed(tiny_loaded):
    from mlxcel.engine.config import CascadeConfig, EngineConfig
    from mlxcel.engine.engine import Engine

    engine = Engine(tiny_loaded, EngineConfig(num_blocks=16), cascade=CascadeConfig())
    with running_server(engine, api_key=KEY) as (base, server):
        yield base, server
    engine.stop()


def endpoints(server):
    """Every (method, path) the app routes, HEAD aside."""
    return [(method, route.path) for route in server.app.routes for method in sorted(route.methods - {"HEAD"})]


def call(base, method, path, headers):
    body = GOOD_BODIES.get(path) if method == "POST" else None
    return httpx.request(method, base + path, json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("authorization", [None, f"Bearer {KEY}x", f"bearer {KEY}", KEY, f"Basic {KEY}"])
def test_every_endpoint_but_metrics_demands_the_key(keyed, authorization):
    base, server = keyed
    headers = {} if authorization is None else {"Authorization": authorization}
    routes = endpoints(server)
    assert len(routes) >= 10 and ("POST", "/v1/cascade") in routes
    for method, path in routes:
        response = call(base, method, path, headers)
        if path == "/metrics":
            assert response.status_code == 200
        else:
            error = assert_openai_error(response, 401)
            assert error["type"] == "authentication_error", (method, path)
    assert_openai_error(httpx.get(f"{base}/no/such/path", headers=headers), 401)  # no route probing either


def test_the_key_opens_every_endpoint(keyed):
    base, server = keyed
    for method, path in endpoints(server):
        response = call(base, method, path, {"Authorization": f"Bearer {KEY}"})
        assert response.status_code != 401, (method, path)
        assert response.status_code == (404 if path == "/v1/sessions" else 200), (method, path, response.text)


def test_control_changes_without_the_key_change_nothing(keyed):
    base, server = keyed
    before = server.engine.cascade.as_dict()
    httpx.post(f"{base}/v1/cascade", json={"enabled": not before["enabled"]})
    httpx.post(f"{base}/v1/engine", json={"paused": True})
    assert server.engine.cascade.as_dict() == before and server.engine.paused is False


def test_serve_beyond_loopback_with_the_key_from_the_environment(mlxcel_home):
    serve = ServeProcess(["tiny", "--host", "0.0.0.0", "--port", "0", "--sessions", "0"],
                         cli_env(mlxcel_home, MLXCEL_API_KEY=KEY))
    try:
        url = serve.url.replace("0.0.0.0", "127.0.0.1")
        assert_openai_error(httpx.get(f"{url}/v1/models", timeout=10), 401)
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0
    finally:
        serve.kill()


# -- no client-named files ------------------------------------------------------

_opened: list[str] | None = None


def _audit(event, args):
    if event == "open" and _opened is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # hooks cannot be removed; this one records only while a test asks it to


@contextlib.contextmanager
def files_opened():
    """Record the paths this process opens inside the block."""
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


@pytest.fixture
def no_model_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a request tried to load a model")

    monkeypatch.setattr(model_module, "load_model", refuse)
    monkeypatch.setattr(cli, "build_engine", refuse)


def test_requests_naming_paths_read_nothing(make_engine, tmp_path, no_model_loading):
    bait = tmp_path / "bait-model"
    bait.mkdir()
    (bait / "config.json").write_text(json.dumps({"model_type": "llama"}))
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    names = [str(bait), str(secret), f"file://{secret}", "../../../../etc/passwd", str(bait / "config.json")]
    with files_opened() as opened:  # the recorder itself works
        secret.read_text()
    assert str(secret) in opened
    with running_server(make_engine(num_blocks=16)) as (base, server), files_opened() as opened:
        for name in names:
            assert_openai_error(httpx.post(f"{base}/v1/completions", json={"model": name, "prompt": "hi"}), 404)
            assert_openai_error(httpx.post(f"{base}/v1/chat/completions", json={
                "model": name, "messages": [{"role": "user", "content": "hi"}]}), 404)
            for path, body in (("/v1/cascade", {"model": name}), ("/v1/cascade", {"path": name}),
                               ("/v1/engine", {"model": name})):
                assert_openai_error(httpx.post(f"{base}{path}", json=body), 400)
            assert_openai_error(httpx.get(f"{base}/{name.lstrip('/')}"), 404)
        # A path as prompt text is only text.
        reply = httpx.post(f"{base}/v1/completions", json={"prompt": str(secret), "max_tokens": 1}, timeout=30)
        assert reply.status_code == 200
    touched = [p for p in opened if str(tmp_path) in p or p.endswith("passwd")]
    assert touched == []
