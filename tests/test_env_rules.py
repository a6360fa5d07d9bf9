"""MLXCEL_CASCADE_* follow DESIGN.md exactly: accepted spellings, plain
integers at or above the minimum; anything else takes the shipped default and
is logged once. (tests/test_config.py covers the flag spellings.)"""

from __future__ import annotations

import logging

import pytest

from mlxcel.engine import config as config_module
from mlxcel.engine.config import CascadeConfig

PAGES = "MLXCEL_CASCADE_MIN_SHARED_PAGES"
MEMBERS = "MLXCEL_CASCADE_MIN_MEMBERS"
ENABLED = "MLXCEL_CASCADE_ATTENTION"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(config_module, "_warned", set())


@pytest.mark.parametrize("text, value", [("8", 8), (" 8\n", 8), ("08", 8), ("1", 1), ("100000", 100000)])
def test_plain_integers_are_taken(text, value, caplog):
    with caplog.at_level(logging.WARNING):
        assert CascadeConfig.from_env({PAGES: text}).min_shared_pages == value
    assert caplog.records == []


@pytest.mark.parametrize("text", ["+8", "1_000", "٣", "８", "0x10", "1e3", "8.0", "8 pages", "- 8", "9" * 5000])
def test_anything_else_takes_the_default_and_is_logged_once(text, caplog):
    with caplog.at_level(logging.WARNING, logger="mlxcel.engine.config"):
        for _ in range(3):  # read again and again (engines, CLI, dashboard): one warning
            config = CascadeConfig.from_env({PAGES: text, MEMBERS: text})
    assert (config.min_shared_pages, config.min_members) == (16, 2)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert any(PAGES in m for m in messages) and any(MEMBERS in m for m in messages)
    assert all("using the default" in m for m in messages)


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_is_unset(text, caplog):
    with caplog.at_level(logging.WARNING):
        config = CascadeConfig.from_env({ENABLED: text, PAGES: text, MEMBERS: text})
    assert config.as_dict() == {"enabled": False, "min_shared_pages": 16, "min_members": 2}
    assert caplog.records == []


def test_each_distinct_bad_value_is_logged_once(caplog):
    with caplog.at_level(logging.WARNING, logger="mlxcel.engine.config"):
        for text in ("maybe", "maybe", "perhaps", "maybe", "perhaps"):
            assert CascadeConfig.from_env({ENABLED: text}).enabled is False
    assert [r.getMessage().split("=")[1].split()[0] for r in caplog.records] == ["'maybe'", "'perhaps'"]


def test_members_below_two_take_the_default(caplog):
    with caplog.at_level(logging.WARNING, logger="mlxcel.engine.config"):
        assert CascadeConfig.from_env({MEMBERS: "1"}).min_members == 2
    assert len(caplog.records) == 1


def test_the_engine_reads_the_environment_once_at_start(monkeypatch, tiny_loaded):
    from mlxcel.engine.config import EngineConfig
    from mlxcel.engine.engine import Engine

    monkeypatch.setenv(ENABLED, "on")
    monkeypatch.setenv(PAGES, "4")
    engine = Engine(tiny_loaded, EngineConfig(num_blocks=8))
    monkeypatch.setenv(ENABLED, "off")
    assert engine.cascade.as_dict() == {"enabled": True, "min_shared_pages": 4, "min_members": 2}


def test_cli_flags_override_the_environment(monkeypatch, tiny_model_path, caplog):
    from mlxcel_tui.workload import build_engine

    monkeypatch.setenv(ENABLED, "yes")
    monkeypatch.setenv(PAGES, "lots")
    monkeypatch.setenv(MEMBERS, "5")
    with caplog.at_level(logging.WARNING, logger="mlxcel.engine.config"):
        engine = build_engine("tiny", cascade=False, min_shared_pages=None, min_members=3, kv_blocks=8)
    assert engine.cascade.as_dict() == {"enabled": False, "min_shared_pages": 16, "min_members": 3}
    assert [PAGES in r.getMessage() for r in caplog.records] == [True]
