"""A real server on loopback for tests: engine thread + uvicorn thread."""

from __future__ import annotations

import contextlib
import threading
import time

from mlxcel.engine.server import OpenAIServer, make_uvicorn


@contextlib.contextmanager
def running_server(engine, sessions=None, api_key=None, limits=None):
    """Yield (base url, OpenAIServer) while the engine and uvicorn run."""
    server = OpenAIServer(engine, engine.loaded.name, sessions=sessions, api_key=api_key, limits=limits)
    uv = make_uvicorn(server.app, "127.0.0.1", 0)
    sock = uv.config.bind_socket()
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    engine.start()
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        uv.should_exit = True
        thread.join(10)
        engine.stop()
