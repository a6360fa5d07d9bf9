"""A large prompt costs the server bounded work, off its event loop: one over
the character bound is refused without tokenizing, one under it is tokenized
on a worker thread while /health and running streams keep their pace, and the
memory tokenizing took is given back."""

from __future__ import annotations

import gc
import threading
import time

import httpx
import psutil
import pytest
from reliability import assert_openai_error, assert_pool_at_baseline, wait_until
from serving import running_server

from mlxcel.engine.limits import ServerLimits
from mlxcel.engine.prompts import longest_token_chars

MIB = 2**20
TEXT = "hello world, this is a fairly ordinary sentence of english text. "


def text_of(chars: int) -> str:
    return (TEXT * (chars // len(TEXT) + 1))[:chars]


class EncodeSpy:
    """Counts and times the tokenizer's encode calls (the real encode runs)."""

    def __init__(self, tokenizer, monkeypatch) -> None:
        self.calls: list[tuple[float, float]] = []
        encode = tokenizer.encode

        def timed(*args, **kwargs):
            started = time.monotonic()
            try:
                return encode(*args, **kwargs)
            finally:
                self.calls.append((started, time.monotonic()))

        monkeypatch.setattr(tokenizer, "encode", timed)


@pytest.fixture
def served(make_engine, monkeypatch):
    def serve(limits):
        engine = make_engine(num_blocks=64)
        spy = EncodeSpy(engine.tokenizer, monkeypatch)
        return engine, spy, running_server(engine, limits=limits)
    return serve


def test_a_4mb_prompt_is_refused_without_tokenizing(served):
    """The issue's 4 MB prompt under the default limits: it was tokenized on the
    event loop for 2.4 s before its 400."""
    limits = ServerLimits()
    engine, spy, server = served(limits)
    bound = limits.max_prompt_tokens * longest_token_chars(engine.tokenizer)
    prompt = text_of(4_000_000)
    assert len(prompt) > bound
    with server as (base, _):
        started = time.monotonic()
        reply = httpx.post(f"{base}/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=30)
        seconds = time.monotonic() - started
    print(f"\na 4,000,000-character prompt refused in {seconds:.3f} s")
    error = assert_openai_error(reply, 400)
    assert error["param"] == "prompt" and "4000000 characters" in error["message"]
    assert spy.calls == []
    assert seconds < 1.0


def test_tokenizing_leaves_the_event_loop_and_streams_running(served):
    """A prompt under the character bound but over the token limit is tokenized
    (about a second here) and refused; meanwhile /health answers and a running
    stream keeps streaming."""
    limits = ServerLimits(max_prompt_tokens=100_000)
    engine, spy, server = served(limits)
    with server as (base, _), httpx.Client(base_url=base, timeout=30) as client:
        arrivals: list[float] = []
        health: list[tuple[float, float]] = []
        done = threading.Event()

        def stream():
            body = {"prompt": [5, 6, 7], "max_tokens": 2000, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as response:
                for line in response.iter_lines():
                    arrivals.append(time.monotonic())
                    if done.is_set():
                        return

        def poll():
            while not done.is_set():
                started = time.monotonic()
                assert client.get("/health").status_code == 200
                health.append((started, time.monotonic()))

        threads = [threading.Thread(target=stream), threading.Thread(target=poll)]
        for thread in threads:
            thread.start()
        assert wait_until(lambda: len(arrivals) >= 5)
        reply = httpx.post(f"{base}/v1/completions", json={"prompt": text_of(1_200_000)}, timeout=60)
        done.set()
        for thread in threads:
            thread.join(30)
        assert wait_until(lambda: engine.pool.num_live == 0)
    error = assert_openai_error(reply, 400)
    assert error["param"] == "prompt" and "tokens; the limit is 100000" in error["message"]
    [(start, end)] = [call for call in spy.calls if call[1] - call[0] > 0.1]
    took = end - start
    during = [b - a for a, b in health if start <= a <= end]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:]) if start <= b <= end]
    print(f"\ntokenizing took {took:.2f} s; meanwhile {len(during)} /health (slowest {max(during):.3f} s), "
          f"{len(gaps)} stream chunks (longest gap {max(gaps):.3f} s)")
    assert len(during) >= 3 and max(during) < took / 2
    assert len(gaps) >= 3 and max(gaps) < took / 2
    assert_pool_at_baseline(engine)


def test_the_memory_tokenizing_took_is_given_back(served):
    limits = ServerLimits(max_prompt_tokens=100_000)
    engine, spy, server = served(limits)
    process = psutil.Process()
    with server as (base, _):
        small = {"prompt": text_of(1000), "max_tokens": 2}
        for _ in range(2):  # warm-up: the model's buffers
            assert httpx.post(f"{base}/v1/completions", json=small, timeout=60).status_code == 200
        assert wait_until(lambda: not engine.scheduler.has_work)
        time.sleep(0.2)  # the engine thread's last step (the reply is sent before it ends)
        gc.collect()
        before = process.memory_info().rss
        for _ in range(2):
            reply = httpx.post(f"{base}/v1/completions", json={"prompt": text_of(1_200_000)}, timeout=60)
            assert_openai_error(reply, 400)
        gc.collect()
        after = process.memory_info().rss
    # Not given back, the tokenizer's buffers stayed: +216 MiB here (4 MB of text: 1.1 -> 2.2 GiB in the issue).
    # Given back, -16 to +25 MiB: the 1.2 MB bodies' buffers on both ends of the connection remain as noise.
    print(f"\nRSS {before / MIB:.1f} -> {after / MIB:.1f} MiB around two 1.2M-character prompts")
    assert after - before < 64 * MIB
