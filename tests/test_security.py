"""Loopback by default, an API key required beyond it, a bearer token on every
endpoint but /metrics and /health when a key is set, and no endpoint touching files a
client names."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import httpx
import psutil
import pytest
from cli_process import ServeProcess, cli_env, run_cli
from reliability import assert_openai_error
from serving import running_server

from mlxcel.engine import model as model_module
from mlxcel.engine.builtin_models import TINY_MODEL_NAME
from mlxcel.engine.listen import check_bind
from mlxcel.engine.server import is_local_host
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
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [5, 6]},
}
PATHS = {"/v1/models/{model_id:path}": "/v1/models/" + TINY_MODEL_NAME}


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
    return httpx.request(method, base + PATHS.get(path, path), json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("authorization", [None, f"Bearer {KEY}x", f"bearer {KEY}", KEY, f"Basic {KEY}"])
def test_every_endpoint_but_metrics_and_health_demands_the_key(keyed, authorization):
    base, server = keyed
    headers = {} if authorization is None else {"Authorization": authorization}
    routes = endpoints(server)
    assert len(routes) >= 10 and ("POST", "/v1/cascade") in routes
    for method, path in routes:
        response = call(base, method, path, headers)
        if path in ("/metrics", "/health"):
            assert response.status_code == 200
        else:
            error = assert_openai_error(response, 401)
            assert error["type"] == "authentication_error", (method, path)
            assert response.headers["www-authenticate"] == "Bearer"
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


@pytest.mark.parametrize("source", ["environment", "file"])
def test_serve_beyond_loopback_with_the_key_from_the_environment_or_a_file(mlxcel_home, tmp_path, source):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    args, env = ["tiny", "--host", "0.0.0.0", "--port", "0", "--sessions", "0"], cli_env(mlxcel_home)
    if source == "file":
        args += ["--api-key-file", str(key_file)]
    else:
        env["MLXCEL_API_KEY"] = KEY
    serve = ServeProcess(args, env)
    try:
        url = serve.url.replace("0.0.0.0", "127.0.0.1")
        assert_openai_error(httpx.get(f"{url}/v1/models", timeout=10), 401)
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
        # Any user can read a command line (ps, /proc/PID/cmdline): the key is not on it.
        assert KEY not in " ".join(psutil.Process(serve.proc.pid).cmdline())
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0
    finally:
        serve.kill()


@pytest.mark.parametrize("command", [["serve", "--headless", "--port", "0"], ["attach", "http://127.0.0.1:9"]])
@pytest.mark.parametrize("key, source", [("cl\u00e9", "env"), ("\u5bc6\u94a5", "env"), (" padded", "env"),
                                         ("cl\u00e9", "file"), ("two\nlines", "file")])
def test_a_key_a_header_cannot_carry_is_refused_at_start(mlxcel_home, tmp_path, command, key, source):
    """Header bytes are latin-1 to the server and clients encode non-ASCII
    differently (attach could not send it at all): refused, not half working.
    (A key file's surrounding blanks, its final newline say, are not the key's.)"""
    (tmp_path / "key").write_text(key)
    args, env = ((command + ["--api-key-file", str(tmp_path / "key")], cli_env(mlxcel_home)) if source == "file"
                 else (command, cli_env(mlxcel_home, MLXCEL_API_KEY=key)))
    result = run_cli("mlxcel-tui", args, env)
    assert result.returncode == 1, result
    assert result.stderr.strip().splitlines() == [
        "Error: the API key must be printable ASCII without leading or trailing blanks"], result.stderr


def test_api_key_file_conflicts_and_empty_files_are_refused(mlxcel_home, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    result = run_cli("mlxcel-tui", ["serve", "--headless", "--api-key-file", str(empty)], cli_env(mlxcel_home))
    assert result.returncode == 1 and "is empty" in result.stderr
    full = tmp_path / "key"
    full.write_text(KEY)
    result = run_cli("mlxcel-tui", ["serve", "--headless", "--api-key-file", str(full)],
                     cli_env(mlxcel_home, MLXCEL_API_KEY=KEY))
    assert result.returncode == 2 and "not both" in result.stderr


# -- browsers: cross-site requests and DNS rebinding ------------------------------

@pytest.fixture(scope="module")
def keyless(tiny_loaded):
    """The default server: loopback, no key."""
    from mlxcel.engine.config import CascadeConfig, EngineConfig
    from mlxcel.engine.engine import Engine

    engine = Engine(tiny_loaded, EngineConfig(num_blocks=16), cascade=CascadeConfig())
    with running_server(engine) as (base, server):
        yield base, server
    engine.stop()


def no_cors(response) -> bool:
    return not any(name.lower().startswith("access-control-") for name in response.headers)


def test_a_cross_site_simple_request_changes_nothing(keyless, monkeypatch):
    """The issue's attack, as a page on evil.example would send it: simple POSTs
    (text/plain, no preflight) pausing the engine, changing a threshold and
    running a completion; then the same with a JSON content type."""
    base, server = keyless
    engine = server.engine
    submitted = []
    monkeypatch.setattr(engine, "submit", lambda *args, **kwargs: submitted.append(args))
    before = engine.cascade.as_dict()
    attacks = [("/v1/engine", {"paused": True}), ("/v1/cascade", {"min_shared_pages": 99}),
               ("/v1/completions", {"prompt": "hi", "max_tokens": 1})]
    for content_type in ("text/plain", "application/json"):
        for path, body in attacks:
            response = httpx.post(base + path, content=json.dumps(body), timeout=10,
                                  headers={"Origin": "http://evil.example", "Content-Type": content_type})
            assert assert_openai_error(response, 403)["type"] == "permission_error"
            assert no_cors(response)
    assert engine.paused is False and engine.cascade.as_dict() == before and submitted == []


def test_a_preflight_gets_no_cors_headers(keyless):
    base, server = keyless
    response = httpx.options(f"{base}/v1/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert response.status_code >= 400 and no_cors(response)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example",
                                  "localhost.evil.example:80", "[::2]:80", "0.0.0.0", "10.0.0.1"])
def test_a_foreign_host_is_refused_on_every_route(keyless, host):
    base, server = keyless
    for method, path in endpoints(server) + [("GET", "/no/such/path")]:
        response = call(base, method, path, {"Host": host})
        assert assert_openai_error(response, 403)["type"] == "permission_error", (method, path)


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:8000", "127.0.0.1", "127.0.0.1:1", "127.8.9.10:80",
                                  "[::1]:8000", "app.localhost:8000"])
def test_local_hosts_and_the_same_origin_are_served(keyless, host):
    base, server = keyless
    assert httpx.get(f"{base}/health", headers={"Host": host}).status_code == 200
    same_origin = httpx.post(f"{base}/v1/engine", json={"paused": False},
                             headers={"Host": host, "Origin": f"http://{host}"})
    assert same_origin.status_code == 200


def test_the_host_check_is_off_with_a_key_or_when_opted_out(keyed, make_engine):
    base, server = keyed
    key = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{base}/v1/models", headers=key | {"Host": "api.example.com"}).status_code == 200
    assert_openai_error(httpx.get(f"{base}/v1/models", headers=key | {"Origin": "http://evil.example"}), 403)
    with running_server(make_engine(num_blocks=16), check_host=False) as (base, server):
        assert httpx.get(f"{base}/v1/models", headers={"Host": "evil.example"}).status_code == 200
        assert_openai_error(httpx.get(f"{base}/v1/models", headers={"Origin": "http://evil.example"}), 403)


@pytest.mark.parametrize("host, bound, local", [
    ("localhost:80", "127.0.0.1", True), ("[::1]", "::1", True), ("::1", "127.0.0.1", True),
    ("myhost:8000", "myhost", True), ("MyHost", "myhost", True), ("myhost", "127.0.0.1", False),
    ("127.0.0.1@evil.example", "127.0.0.1", False), ("[::1", "127.0.0.1", False), ("", "127.0.0.1", False)])
def test_is_local_host(host, bound, local):
    assert is_local_host(host, bound) is local


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
