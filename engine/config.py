"""Cascade attention settings: read once from the environment at start, then
changed live by the dashboard and the control API (validated, thread-safe)."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

log = logging.getLogger(__name__)

ENABLED_ENV = "MLXCEL_CASCADE_ATTENTION"
MIN_SHARED_PAGES_ENV = "MLXCEL_CASCADE_MIN_SHARED_PAGES"
MIN_MEMBERS_ENV = "MLXCEL_CASCADE_MIN_MEMBERS"

TRUE_SPELLINGS = frozenset({"1", "true", "on", "yes"})
FALSE_SPELLINGS = frozenset({"0", "false", "off", "no"})

DEFAULT_ENABLED = False
DEFAULT_MIN_SHARED_PAGES = 16
DEFAULT_MIN_MEMBERS = 2

_warned: set[tuple[str, str]] = set()


class ConfigError(ValueError):
    """A setting was refused; the previous values stay in force."""


@dataclass(frozen=True)
class CascadeSettings:
    """One consistent reading of the config (what a decode step uses)."""

    enabled: bool
    min_shared_pages: int
    min_members: int
    version: int


def parse_flag(text: str | None) -> bool | None:
    """True/False for an accepted spelling (case and surrounding blanks ignored), else None."""
    word = (text or "").strip().lower()
    if word in TRUE_SPELLINGS:
        return True
    if word in FALSE_SPELLINGS:
        return False
    return None


def _warn_once(name: str, text: str, default: Any) -> None:
    if (name, text) not in _warned:
        _warned.add((name, text))
        log.warning("%s=%r is not a valid value; using the default %r", name, text, default)


def _env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    text = env.get(name)
    flag = parse_flag(text)
    if flag is None:
        if text is not None and text.strip():
            _warn_once(name, text, default)
        return default
    return flag


def _env_int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    text = env.get(name)
    if text is None or not text.strip():
        return default
    digits = text.strip()
    # Plain ASCII digits only: int() would also take "+8", "1_000" and other scripts' digits.
    try:
        value = int(digits) if digits.isascii() and digits.isdigit() else None
    except ValueError:  # more digits than int() converts
        value = None
    if value is None or value < minimum:
        _warn_once(name, text, default)
        return default
    return value


def _validate(enabled: Any, min_shared_pages: Any, min_members: Any) -> None:
    if not isinstance(enabled, bool):
        raise ConfigError(f"enabled must be true or false, got {enabled!r}")
    for name, value, minimum in (("min_shared_pages", min_shared_pages, 1),
                                 ("min_members", min_members, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")


FIELDS = ("enabled", "min_shared_pages", "min_members")


@dataclass
class CascadeConfig:
    """Live cascade settings. Assigning a field goes through ``update``, so a
    bad value is refused with ConfigError and nothing changes. ``version``
    moves on every change."""

    enabled: bool = DEFAULT_ENABLED
    min_shared_pages: int = DEFAULT_MIN_SHARED_PAGES
    min_members: int = DEFAULT_MIN_MEMBERS
    version: int = field(default=0, init=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _validate(self.enabled, self.min_shared_pages, self.min_members)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in FIELDS and "_lock" in self.__dict__:
            self.update(**{name: value})
        else:
            object.__setattr__(self, name, value)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "CascadeConfig":
        """Settings from MLXCEL_CASCADE_*; an unexpected value takes the default
        and is logged once as a warning."""
        env = os.environ if environ is None else environ
        return cls(
            enabled=_env_flag(env, ENABLED_ENV, DEFAULT_ENABLED),
            min_shared_pages=_env_int(env, MIN_SHARED_PAGES_ENV, DEFAULT_MIN_SHARED_PAGES, 1),
            min_members=_env_int(env, MIN_MEMBERS_ENV, DEFAULT_MIN_MEMBERS, 2),
        )

    def update(self, **changes: Any) -> CascadeSettings:
        """Change some settings at once, all or nothing; returns the new settings."""
        unknown = sorted(set(changes) - set(FIELDS))
        if unknown:
            raise ConfigError(f"unknown cascade setting {', '.join(map(repr, unknown))} "
                              f"(known: {', '.join(FIELDS)})")
        with self._lock:
            merged = {name: getattr(self, name) for name in FIELDS} | changes
            _validate(**merged)
            changed = any(getattr(self, name) != merged[name] for name in FIELDS)
            for name in FIELDS:
                object.__setattr__(self, name, merged[name])
            if changed:
                object.__setattr__(self, "version", self.version + 1)
            return self._settings()

    def snapshot(self) -> CascadeSettings:
        """A consistent reading of every field (a concurrent update is all-or-nothing)."""
        with self._lock:
            return self._settings()

    def as_dict(self) -> dict[str, Any]:
        settings = self.snapshot()
        return {name: getattr(settings, name) for name in FIELDS}

    def _settings(self) -> CascadeSettings:
        return CascadeSettings(self.enabled, self.min_shared_pages, self.min_members, self.version)


@dataclass
class EngineConfig:
    """Engine sizing, fixed at start."""

    block_size: int = 32
    num_blocks: int | None = None  # pool size in blocks; None: from pool_bytes
    pool_bytes: int = 1 << 30
    kv_dtype: str | None = None  # pool.KV_DTYPES: "bfloat16", "int8", ...; None: the model's own dtype
    max_running: int = 64
    max_batched_tokens: int = 512  # tokens a step computes: the decodes' and a prefill chunk's
    prefix_caching: bool = True

    def pool_blocks(self, geometry) -> int:
        """The pool's blocks: ``num_blocks``, else as many of ``geometry``'s as ``pool_bytes`` holds."""
        return self.num_blocks or geometry.blocks_for_bytes(self.pool_bytes)
