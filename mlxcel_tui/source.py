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
    def session_answers(self) -> list[dict]: ...


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

    def session_answers(self) -> list[dict]:
        if self.sessions is None:
            return []
        return [s.as_dict() for s in list(self.sessions.sessions)]


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

    def session_answers(self) -> list[dict]:
        """The server's sessions with their latest questions and answers."""
        response = self._request("GET", "/v1/sessions")
        return response.json()["sessions"]


class SourceNotReady(SourceError):
    """The engine is still being prepared; the message says what is happening."""


class SourceFailed(SourceError):
    """The source will never be ready: the dashboard closes and the command says why."""


class StartingSource:
    """Stands in for an in-process engine while `serve` prepares it (converting
    or loading the model) so the dashboard is up at once; from ready() on it is
    that engine's source. Control calls are refused until then."""

    def __init__(self) -> None:
        self.inner: EngineSource | None = None
        self.error: BaseException | None = None
        self.status = "preparing the model"

    @property
    def can_control(self) -> bool:
        return self.inner is not None

    @property
    def description(self) -> str:
        return self.inner.description if self.inner else "in-process · preparing"

    def stage(self, what: str) -> None:
        self.status = f"preparing the model: {what}"

    def progress(self, what: str, done: int, total: int) -> None:
        self.stage(f"{what}, {done}/{total} tensors")

    def ready(self, inner: EngineSource) -> None:
        self.inner = inner

    def failed(self, error: BaseException) -> None:
        self.error = error

    def _source(self) -> EngineSource:
        if self.error is not None:
            raise SourceFailed(str(self.error))
        if self.inner is None:
            raise SourceNotReady(self.status)
        return self.inner

    def snapshot(self) -> dict:
        return self._source().snapshot()

    def metrics(self) -> dict[str, float]:
        return self._source().metrics()

    def set_cascade(self, **changes) -> dict:
        return self._source().set_cascade(**changes)

    def change_sessions(self, add: int = 0, remove: int = 0) -> None:
        self._source().change_sessions(add, remove)

    def set_paused(self, paused: bool) -> None:
        self._source().set_paused(paused)

    def session_answers(self) -> list[dict]:
        return self._source().session_answers()
