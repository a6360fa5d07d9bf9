"""CascadeConfig: environment parsing and validated, thread-safe live updates."""

from __future__ import annotations

import logging
import threading

import pytest

from mlxcel.engine import config as config_module
from mlxcel.engine.config import CascadeConfig, ConfigError

ENABLED = "MLXCEL_CASCADE_ATTENTION"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(config_module, "_warned", set())


@pytest.mark.parametrize("text", ["1", "true", "on", "yes", "TRUE", " Yes ", "On"])
def test_enabling_spellings(text):
    assert CascadeConfig.from_env({ENABLED: text}).enabled is True


@pytest.mark.parametrize("text", ["0", "false", "off", "no", "FALSE", " No\n", "Off"])
def test_disabling_spellings(text):
    assert CascadeConfig.from_env({ENABLED: text}).enabled is False


def test_unset_takes_the_default_silently(caplog):
    with caplog.at_level(logging.WARNING):
        config = CascadeConfig.from_env({})
    assert (config.enabled, config.min_shared_pages, config.min_members) == (False, 16, 2)
    assert caplog.records == []


@pytest.mark.parametrize("text", ["2", "enable", "y", "tru", "nope", "-1", "1.0"])
def test_rejected_spellings_take_the_default_with_one_warning(text, caplog):
    with caplog.at_level(logging.WARNING):
        assert CascadeConfig.from_env({ENABLED: text}).enabled is False
        assert CascadeConfig.from_env({ENABLED: text}).enabled is False
    assert len(caplog.records) == 1 and ENABLED in caplog.records[0].getMessage()


def test_thresholds_from_env():
    config = CascadeConfig.from_env({ENABLED: "on", "MLXCEL_CASCADE_MIN_SHARED_PAGES": " 4 ",
                                     "MLXCEL_CASCADE_MIN_MEMBERS": "3"})
    assert config.as_dict() == {"enabled": True, "min_shared_pages": 4, "min_members": 3}


@pytest.mark.parametrize("name, text, default", [
    ("MLXCEL_CASCADE_MIN_SHARED_PAGES", "abc", 16), ("MLXCEL_CASCADE_MIN_SHARED_PAGES", "0", 16),
    ("MLXCEL_CASCADE_MIN_SHARED_PAGES", "1.5", 16), ("MLXCEL_CASCADE_MIN_MEMBERS", "1", 2),
    ("MLXCEL_CASCADE_MIN_MEMBERS", "-2", 2), ("MLXCEL_CASCADE_MIN_MEMBERS", "two", 2),
])
def test_invalid_thresholds_take_the_default_with_a_warning(name, text, default, caplog):
    with caplog.at_level(logging.WARNING):
        config = CascadeConfig.from_env({name: text})
    key = "min_shared_pages" if "SHARED" in name else "min_members"
    assert config.as_dict()[key] == default
    assert len(caplog.records) == 1 and name in caplog.records[0].getMessage()


@pytest.mark.parametrize("changes", [
    {"enabled": "yes"}, {"enabled": 1}, {"min_shared_pages": 0}, {"min_shared_pages": "16"},
    {"min_shared_pages": 1.5}, {"min_shared_pages": True}, {"min_members": 1},
    {"enabled": True, "min_members": 0},          # one bad value refuses the whole update
    {"min_pages": 4},
])
def test_invalid_updates_are_refused_and_nothing_changes(changes):
    config = CascadeConfig(enabled=False, min_shared_pages=8, min_members=3)
    with pytest.raises(ConfigError) as refused:
        config.update(**changes)
    assert isinstance(refused.value, ValueError)
    assert config.as_dict() == {"enabled": False, "min_shared_pages": 8, "min_members": 3}
    assert config.version == 0


def test_messages_name_the_setting():
    config = CascadeConfig()
    with pytest.raises(ConfigError, match=r"min_members must be an integer >= 2, got 1"):
        config.update(min_members=1)
    with pytest.raises(ConfigError, match=r"unknown cascade setting 'min_pages'"):
        config.update(min_pages=3)
    with pytest.raises(ConfigError, match=r"enabled must be true or false"):
        CascadeConfig(enabled="on")


def test_assignment_is_validated_too():
    config = CascadeConfig()
    config.min_shared_pages = 4
    assert config.min_shared_pages == 4 and config.version == 1
    with pytest.raises(ConfigError):
        config.min_shared_pages = 0
    assert config.min_shared_pages == 4


def test_version_moves_only_on_change():
    config = CascadeConfig()
    settings = config.update(enabled=True, min_members=4)
    assert settings.version == config.version == 1 and settings.enabled and settings.min_members == 4
    config.update(enabled=True)
    assert config.version == 1


def test_concurrent_readers_see_whole_updates():
    config = CascadeConfig()
    states = [dict(enabled=True, min_shared_pages=8, min_members=3),
              dict(enabled=False, min_shared_pages=16, min_members=2)]
    seen, stop = set(), threading.Event()

    def writer(i):
        while not stop.is_set():
            config.update(**states[i % 2])
            i += 1

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(3000):
            s = config.snapshot()
            seen.add((s.enabled, s.min_shared_pages, s.min_members))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert seen <= {tuple(s.values()) for s in states}
