"""Where the dashboard and `mlxcel stats` read from: an engine in this process,
or a server's /metrics and /v1/cascade over HTTP. Both give the same shapes:
the snapshot as a dict (EngineSnapshot.to_dict()) and the metric samples keyed
by Prometheus sample name with labels, e.g.
``mlxcel_paged_decode_launches_total{path="cascade"}``."""

from __future__ import annotations

from typing import Iterable, Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families


class SourceError(RuntimeError):
    """The data source cannot be read or refused a change; the message says why."""


def sample_key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def samples_dict(families: Iterable) -> dict[str, float]:
    return {sample_key(s.name, s.labels): s.value for family in families for s in family.samples}


class DataSource(Protocol):
    can_control: bool
    description: str

    def snapshot(self) -> dict: ...
    def metrics(self) -> dict[str, float]: ...
    def set_cascade(self, **changes) -> dict: ...
    def change_sessions(self, add: int = 0, remove: int = 0) -> None: ...
    def set_paused(self, paused: bool) -> None: ...


class EngineSource:
    """An engine (and its sessions) living in this process."""

    can_control = True

    def __init__(self, engine, sessions=None) -> None:
        self.engine = engine
        self.sessions = sessions
        self.description = f"in-process · {engine.loaded.name}"

    def snapshot(self) -> dict:
        return self.engine.snapshot.to_dict()

    def metrics(self) -> dict[str, float]:
        return samples_dict(self.engine.metrics.registry.collect())

    def set_cascade(self, **changes) -> dict:
        from mlxcel.engine.config import ConfigError

        try:
            self.engine.cascade.update(**changes)
        except ConfigError as err:
            raise SourceError(str(err)) from None
        return self.engine.cascade.as_dict()

    def change_sessions(self, add: int = 0, remove: int = 0) -> None:
        if self.sessions is None:
            raise SourceError("this engine runs no built-in sessions")
        from mlxcel.engine.sessions import TooManySessions

        try:
            self.sessions.add(add)
        except TooManySessions as err:
            raise SourceError(str(err)) from None
        self.sessions.remove(remove)

    def set_paused(self, paused: bool) -> None:
        self.engine.set_paused(paused)


class HttpSource:
    """A running server, read through its public endpoints."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.description = f"attached · {self.url}"
        self.can_control = True  # until the server refuses a change

    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise SourceError(f"cannot reach {self.url}: {err}") from None
        if response.status_code >= 400:
            if response.status_code in (401, 403) and method != "GET":
                self.can_control = False
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text.strip() or response.reason_phrase
            raise SourceError(f"{self.url}{path}: {response.status_code} {message}")
        return response

    def snapshot(self) -> dict:
        return self._request("GET", "/v1/cascade").json()["snapshot"]

    def metrics_text(self) -> str:
        return self._request("GET", "/metrics").text

    def metrics(self) -> dict[str, float]:
        return samples_dict(text_string_to_metric_families(self.metrics_text()))

    def set_cascade(self, **changes) -> dict:
        return self._request("POST", "/v1/cascade", json=changes).json()["config"]

    def change_sessions(self, add: int = 0, remove: int = 0) -> None:
        self._request("POST", "/v1/sessions", json={"add": add, "remove": remove})

    def set_paused(self, paused: bool) -> None:
        self._request("POST", "/v1/engine", json={"paused": paused})
