"""A real server on loopback for tests: engine thread + uvicorn thread."""

from __future__ import annotations

import contextlib
import threading
import time

from mlxcel.engine.listen import bind_socket, make_uvicorn, url_of
from mlxcel.engine.server import OpenAIServer


@contextlib.contextmanager
def running_server(engine, sessions=None, api_key=None, limits=None, check_host=True, **uvicorn_options):
    """Yield (base url, OpenAIServer) while the engine and uvicorn run; on the
    way out the server drains as `serve` does (every request ends "cancelled").
    `uvicorn_options` go to make_uvicorn (request_timeout, max_connections);
    the uvicorn server is `server.uvicorn`."""
    server = OpenAIServer(engine, engine.loaded.name, sessions=sessions, api_key=api_key, limits=limits,
                          check_host=check_host)
    uv = server.uvicorn = make_uvicorn(server.app, on_shutdown=server.drain, **uvicorn_options)
    sock = bind_socket("127.0.0.1", 0)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    engine.start()
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield url_of(sock), server
    finally:
        uv.should_exit = True
        thread.join(10)
        engine.stop()
