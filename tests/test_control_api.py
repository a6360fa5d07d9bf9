"""The control API and the dashboard's sources refuse bad changes and keep the
config that was in force."""

from __future__ import annotations

import time

import httpx
import pytest
from reliability import assert_openai_error
from serving import running_server

from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.sessions import SessionManager
from mlxcel_tui.source import EngineSource, HttpSource, SourceError

IN_FORCE = {"enabled": True, "min_shared_pages": 4, "min_members": 3}

BAD_CASCADE = [
    {"min_shared_pages": 0}, {"min_shared_pages": -4}, {"min_shared_pages": 2.5}, {"min_shared_pages": "8"},
    {"min_shared_pages": None}, {"min_members": 1}, {"min_members": True}, {"enabled": "true"},
    {"enabled": 1}, {"enabled": None}, {"bogus": 1}, {"Enabled": False},
    {"enabled": False, "min_members": 1},          # one bad value refuses the whole change
    {"enabled": False, "min_pages": 8},            # so does one unknown field
]


@pytest.fixture(scope="module")
def server_with_sessions(tiny_loaded):
    engine = Engine(tiny_loaded, EngineConfig(num_blocks=64), cascade=CascadeConfig(**IN_FORCE))
    sessions = SessionManager(engine, "a shared system prompt", ["why?"], max_tokens=2, turns=1)
    with running_server(engine, sessions=sessions) as (base, server):
        sessions.add(2)
        with httpx.Client(base_url=base, timeout=30) as client:
            yield client, engine, sessions


@pytest.fixture
def served(server_with_sessions):
    """The module's server with the config in force reset before each test."""
    client, engine, sessions = server_with_sessions
    engine.cascade.update(**IN_FORCE)
    engine.set_paused(False)
    return server_with_sessions


def assert_config_kept(engine, version):
    assert engine.cascade.as_dict() == IN_FORCE and engine.cascade.version == version


# Keys naming update()'s own parameters: once passed on as keyword arguments (a 500).
BAD_CASCADE_KEYS = [{"self": 1}, {"changes": {"enabled": False}}, {"self": 1, "enabled": False}]


@pytest.mark.parametrize("change", BAD_CASCADE + BAD_CASCADE_KEYS)
def test_bad_cascade_change_is_refused_over_http(served, change):
    client, engine, _ = served
    version = engine.cascade.version
    assert_openai_error(client.post("/v1/cascade", json=change), 400)
    assert_config_kept(engine, version)
    assert client.get("/v1/cascade").json()["config"] == IN_FORCE


@pytest.mark.parametrize("raw", [b"[]", b"null", b"{", b'"enabled"', b"\xff", b'{"\\ud800": 1}',
                                 b'{"enabled": false, "\\udfff": 1}'])
def test_cascade_body_that_is_not_an_object_is_refused(served, raw):
    client, engine, _ = served
    version = engine.cascade.version
    response = client.post("/v1/cascade", content=raw, headers={"content-type": "application/json"})
    assert_openai_error(response, 400)
    assert_config_kept(engine, version)


@pytest.mark.parametrize("path", ["/v1/cascade", "/v1/sessions", "/v1/engine"])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_control_body_that_is_not_declared_json_changes_nothing(served, path, content_type):
    """The browser's 'simple' requests (no preflight) cannot carry a JSON content type."""
    client, engine, sessions = served
    version, before = engine.cascade.version, [s.id for s in sessions.sessions]
    body = b'{"enabled": false, "paused": true, "add": 1}'
    headers = {"content-type": content_type} if content_type else {}
    assert_openai_error(client.post(path, content=body, headers=headers), 415)
    assert_config_kept(engine, version)
    assert engine.paused is False and [s.id for s in sessions.sessions] == before


@pytest.mark.parametrize("change", BAD_CASCADE)
def test_bad_cascade_change_is_refused_by_both_dashboard_sources(served, change):
    client, engine, sessions = served
    version = engine.cascade.version
    for source in (EngineSource(engine, sessions), HttpSource(str(client.base_url))):
        with pytest.raises(SourceError):
            source.set_cascade(**change)
        assert_config_kept(engine, version)


def test_good_change_applies_through_each_path(served):
    client, engine, sessions = served
    assert client.post("/v1/cascade", json={"min_members": 4}).json()["config"]["min_members"] == 4
    assert EngineSource(engine, sessions).set_cascade(min_shared_pages=2)["min_shared_pages"] == 2
    assert HttpSource(str(client.base_url)).set_cascade(enabled=False)["enabled"] is False
    assert engine.cascade.as_dict() == {"enabled": False, "min_shared_pages": 2, "min_members": 4}


@pytest.mark.parametrize("change", [
    {"add": -1}, {"add": 65}, {"add": "2"}, {"add": 1.0}, {"remove": True}, {"bogus": 1},
    {"add": 1, "remove": "all"},                   # validated together: the add does not happen either
    b'{"\\ud800": 1}', b'{"add": 1, "\\ud800": 1}',  # a lone surrogate as a key, echoed in the message
])
def test_bad_sessions_change_is_refused(served, change):
    client, engine, sessions = served
    before = [s.id for s in sessions.sessions]
    request = ({"content": change, "headers": {"content-type": "application/json"}} if isinstance(change, bytes)
               else {"json": change})
    assert_openai_error(client.post("/v1/sessions", **request), 400)
    assert [s.id for s in sessions.sessions] == before


@pytest.mark.parametrize("change", [{}, {"paused": "yes"}, {"paused": 1}, {"paused": True, "x": 1}])
def test_bad_engine_change_is_refused(served, change):
    client, engine, _ = served
    assert_openai_error(client.post("/v1/engine", json=change), 400)
    assert engine.paused is False
    assert client.get("/v1/engine").json() == {"paused": False}


def test_sessions_endpoint_without_sessions_is_a_404(make_engine):
    with running_server(make_engine()) as (base, server):
        error = assert_openai_error(httpx.post(f"{base}/v1/sessions", json={"add": 1}), 404)
    assert error["type"] == "not_found_error"


def test_sessions_past_the_limit_are_refused_and_none_added(served, monkeypatch):
    import mlxcel.engine.sessions as sessions_module

    client, engine, sessions = served
    monkeypatch.setattr(sessions_module, "MAX_SESSIONS", len(sessions.sessions) + 1)
    before = [s.id for s in sessions.sessions]
    error = assert_openai_error(client.post("/v1/sessions", json={"add": 2}), 400)
    assert "limit" in error["message"]
    assert [s.id for s in sessions.sessions] == before
    with pytest.raises(SourceError, match="limit"):
        EngineSource(engine, sessions).change_sessions(add=2)
    assert [s.id for s in sessions.sessions] == before


def test_sessions_are_listed_with_their_latest_question_and_answer(served):
    client, engine, sessions = served
    deadline = time.monotonic() + 60
    while not all(s.last_answer for s in sessions.sessions) and time.monotonic() < deadline:
        time.sleep(0.05)
    listed = client.get("/v1/sessions").json()["sessions"]
    assert listed and [s["id"] for s in listed] == [s.id for s in sessions.sessions]
    for entry, session in zip(listed, sessions.sessions):
        assert entry["question"] == session.last_question == "why?"
        assert entry["answer"] == session.last_answer != ""
