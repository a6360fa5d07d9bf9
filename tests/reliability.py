"""Helpers shared by the reliability tests: OpenAI-style error bodies, SSE
parsing, pool accounting and bounded waits."""

from __future__ import annotations

import json
import time
from typing import Callable


def assert_openai_error(response, status: int | None = None) -> dict:
    """A 4xx with {"error": {"message", "type", "param", "code"}}; returns the error."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    if status is not None:
        assert response.status_code == status, response.text
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert "param" in error and "code" in error
    return error


def sse_events(lines) -> list[dict | str]:
    """Parsed `data:` payloads of an SSE stream ("[DONE]" stays a string)."""
    events = []
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def check_stream(events: list, finish_reasons=("stop", "length")) -> str:
    """Assert a complete, well-formed completion stream; returns its text."""
    assert events and events[-1] == "[DONE]", events[-3:]
    chunks = events[:-1]
    if chunks and chunks[-1].get("choices") == []:  # stream_options.include_usage: a last chunk with usage only
        assert chunks.pop()["usage"]["completion_tokens"] >= 0
    assert chunks and all(isinstance(c, dict) and c["choices"] for c in chunks)
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert all(r is None for r in reasons[:-1]) and reasons[-1] in finish_reasons, reasons
    return "".join(c["choices"][0].get("text") or (c["choices"][0].get("delta") or {}).get("content") or ""
                   for c in chunks)


def wait_until(condition: Callable[[], bool], timeout: float = 10, interval: float = 0.01) -> bool:
    """Poll `condition` until true or the deadline; returns its last value."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        time.sleep(interval)
    return True


def assert_pool_at_baseline(engine) -> None:
    """No sequence holds a page: every refcount is 0 and every kept block is the prefix cache's."""
    pool = engine.pool
    assert pool.num_live == 0, f"{pool.num_live} blocks still held"
    assert all(count == 0 for count in pool.refcount)
    assert all(pool.keep_on_release(block) for block in pool.reusable)  # kept only for the prefix cache
    assert len(pool.free) + len(pool.reusable) == pool.num_blocks
    assert len(set(pool.free)) == len(pool.free)
    sched = engine.scheduler
    assert not sched.running and not sched.waiting and sched.prefilling is None
