"""How the server listens: the loopback rule, the listening socket, and a
uvicorn that ends in-flight requests as soon as shutdown begins.

uvicorn's graceful shutdown closes the listeners and then waits (up to
``timeout_graceful_shutdown``) for open connections to finish, which a stream
with hundreds of tokens to go would not do in time. The server here calls
``on_shutdown`` first, so the engine ends every request with a finish reason
at its next step boundary and the streams close themselves promptly. A
SIGINT or SIGTERM that stopped the server is a request to stop serving, so it
is not re-raised afterwards: a signalled ``serve`` exits 0.

uvicorn times out only idle keep-alive connections: one that never finishes
its request head or body was kept for good, and enough of them took every
file descriptor. Here a request's head and body must arrive within
``request_timeout`` seconds, connections beyond a cap taken from the file
limit are closed as they come (below it, uvicorn's ``limit_concurrency``
answers 503), and each resource warning is logged once per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import resource
import signal
import socket
import threading
import time
from typing import Callable

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REQUEST_TIMEOUT = 10.0  # seconds for a request's head and body to arrive, from its first byte or the connect
FD_RESERVE = 64  # file descriptors kept from connections: model files, logs, the engine's /proc reads
MAX_CONCURRENCY = 1024
LOG_INTERVAL = 10.0
CONNECTION_CAP = "connection refused: this server already holds its most connections"

log = logging.getLogger("mlxcel.listen")


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to listen beyond loopback without an API key."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not api_key:
        raise ValueError(f"refusing to bind {host} without an API key: set MLXCEL_API_KEY or --api-key-file "
                         "(only loopback addresses may serve without one)")


def check_api_key(key: str | None) -> None:
    """Refuse a key that an HTTP header cannot carry as typed: header bytes are
    read as latin-1 and clients encode them differently, so only printable
    ASCII without surrounding blanks matches everywhere."""
    if key and not (key.isascii() and key.isprintable() and key == key.strip()):
        raise ValueError("the API key must be printable ASCII without leading or trailing blanks")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket; raises OSError (port in use, say) without logging anything.

    Made with proto IPPROTO_TCP, where socket.create_server leaves 0: asyncio
    sets TCP_NODELAY only on accepted sockets whose proto says TCP, and without
    it each response after the first on a keep-alive connection waited ~40 ms
    (Nagle's algorithm against the client's delayed ACK)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        if os.name == "posix":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen()
    except BaseException:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_shutdown = on_shutdown

    async def shutdown(self, sockets=None) -> None:
        self.on_shutdown()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn's own, less the re-raise of the captured signal on the way out."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class _OncePerInterval(logging.Filter):
    """Lets each resource warning through once per interval, one line saying how
    many like it were held back: a flood of connections must not become a flood
    of log lines (asyncio logs an accept failing for want of descriptors with a
    traceback, once per connection waiting)."""

    MESSAGES = ("socket.accept() out of system resource", "Exceeded concurrency limit.",
                "Invalid HTTP request received.", CONNECTION_CAP)

    def __init__(self, interval: float = LOG_INTERVAL) -> None:
        super().__init__()
        self.interval = interval
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        message = next((m for m in self.MESSAGES if text.startswith(m)), None)
        if message is None:
            return True
        now = time.monotonic()
        with self._lock:
            last = self._last.get(message)
            if last is not None and now - last < self.interval:
                self._held[message] = self._held.get(message, 0) + 1
                return False
            self._last[message] = now
            held = self._held.pop(message, 0)
        error = record.exc_info[1] if record.exc_info else None
        record.msg = message + (f": {error}" if error else "") + (
            f" ({held} more like it in the {now - last:.0f} s before)" if held else "")
        record.args, record.exc_info, record.exc_text = (), None, None
        return True


RESOURCE_LOG = _OncePerInterval()


class _Config(uvicorn.Config):
    """uvicorn's settings and the two _Protocol reads."""

    def __init__(self, app, request_timeout: float, max_connections: int, **kwargs) -> None:
        super().__init__(app, **kwargs)
        self.request_timeout = request_timeout
        self.max_connections = max_connections


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's head and body,
    and connections beyond the cap closed as soon as they are accepted."""

    config: _Config

    def connection_made(self, transport) -> None:
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.config.max_connections:
            log.warning(CONNECTION_CAP)
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        state = self.conn.their_state
        if state is h11.SEND_BODY or (state is h11.IDLE and self.conn.trailing_data[0]):
            if self._deadline is None:  # the deadline runs from the request's first byte
                self._arm()
        else:
            self._disarm()

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.config.request_timeout, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        """Too slow: close. A handler waiting for the body sees the client gone."""
        self._deadline = None
        self.transport.close()


def connection_caps(max_connections: int | None = None) -> tuple[int, int]:
    """(connections kept, requests served at once): by default the file limit less
    a reserve, and half of that (at most MAX_CONCURRENCY) served, the rest told 503."""
    if max_connections is None:
        max_connections = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - FD_RESERVE
    max_connections = max(8, max_connections)
    return max_connections, min(MAX_CONCURRENCY, max_connections // 2)


def make_uvicorn(app, on_shutdown: Callable[[], None], request_timeout: float = REQUEST_TIMEOUT,
                 max_connections: int | None = None) -> GracefulServer:
    """A server for `app`; run it with ``run(sockets=[bind_socket(host, port)])``."""
    kept, served = connection_caps(max_connections)
    config = _Config(app, request_timeout, kept, http=_Protocol, log_level="warning", lifespan="off",
                     timeout_graceful_shutdown=5, limit_concurrency=served)
    for name in ("asyncio", "uvicorn.error", log.name):
        logging.getLogger(name).addFilter(RESOURCE_LOG)  # the same filter once, however many servers
    return GracefulServer(config, on_shutdown)
