"""How the server listens: the loopback rule, the listening socket, and a
uvicorn that ends in-flight requests as soon as shutdown begins.

uvicorn's graceful shutdown closes the listeners and then waits (up to
``timeout_graceful_shutdown``) for open connections to finish, which a stream
with hundreds of tokens to go would not do in time. The server here calls
``on_shutdown`` first, so the engine ends every request with a finish reason
at its next step boundary and the streams close themselves promptly. A
SIGINT or SIGTERM that stopped the server is a request to stop serving, so it
is not re-raised afterwards: a signalled ``serve`` exits 0.
"""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import threading
from typing import Callable

import uvicorn

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to listen beyond loopback without an API key."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not api_key:
        raise ValueError(f"refusing to bind {host} without an API key: set --api-key or MLXCEL_API_KEY "
                         "(only loopback addresses may serve without one)")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket; raises OSError (port in use, say) without logging anything."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


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


def make_uvicorn(app, on_shutdown: Callable[[], None]) -> GracefulServer:
    """A server for `app`; run it with ``run(sockets=[bind_socket(host, port)])``."""
    config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5)
    return GracefulServer(config, on_shutdown)
