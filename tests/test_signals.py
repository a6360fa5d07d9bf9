"""Ctrl-C or SIGTERM during `mlxcel-tui serve --headless`: the server stops
accepting, in-flight requests end with finish_reason "cancelled" (a stream
gets a final chunk saying so, then [DONE]), and the process exits 0."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest
from cli_process import ServeProcess, cli_env
from reliability import check_stream, sse_events, wait_until

LONG = {"prompt": "tell me everything", "max_tokens": 4000, "ignore_eos": True}


def http_sequences(url) -> int:
    snapshot = httpx.get(f"{url}/v1/cascade", timeout=10).json()["snapshot"]
    return sum(1 for s in snapshot["sequences"] if s["label"] == "http")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_requests_cleanly_and_exits_zero(mlxcel_home, sig):
    serve = ServeProcess(["tiny", "--port", "0", "--sessions", "2", "--shared-prefix-tokens", "16", "--max-tokens", "8"],
                         cli_env(mlxcel_home))
    try:
        stream_lines, replies = [], []

        def stream():
            with httpx.stream("POST", f"{serve.url}/v1/completions", json=LONG | {"stream": True},
                              timeout=30) as response:
                stream_lines.extend(response.iter_lines())

        def whole():
            replies.append(httpx.post(f"{serve.url}/v1/completions", json=LONG, timeout=30))

        threads = [threading.Thread(target=stream), threading.Thread(target=whole)]
        for t in threads:
            t.start()
        assert wait_until(lambda: len(stream_lines) >= 2 and http_sequences(serve.url) == 2, timeout=30)

        signalled = time.monotonic()
        serve.proc.send_signal(sig)
        assert serve.wait(timeout=30) == 0
        took = time.monotonic() - signalled
        for t in threads:
            t.join(10)
    finally:
        serve.kill()

    assert took < 4, f"exit took {took:.1f} s: the requests waited for uvicorn's graceful timeout"
    events = sse_events(stream_lines)
    check_stream(events, finish_reasons=("cancelled",))
    assert replies[0].status_code == 200
    assert replies[0].json()["choices"][0]["finish_reason"] == "cancelled"
    assert "Traceback" not in "".join(serve.stderr)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{serve.url}/health", timeout=5)
