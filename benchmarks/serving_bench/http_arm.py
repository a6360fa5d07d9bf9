"""An arm that is a running server: every client streams its chat completion
over HTTP at once, as a real OpenAI client would.

With ``scrape_metrics`` the arm reads /metrics before and after the level (the
launch-path split, decode-step time, MLX peak memory) and polls it while the
level runs for the pool's live blocks, whose peak times the block size in
bytes (the server's: a quantized page's scales included) is the KV memory the
level held.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import httpx

from .arm_run import ArmRun
from .server_metrics import LIVE_BLOCKS, PEAK_MEMORY, launch_split, parse_metrics
from .stats import RequestRecord
from .workload import Request, Workload

REQUEST_TIMEOUT = httpx.Timeout(1800.0, connect=30.0)


def request_body(request: Request, max_tokens: int, model: str) -> dict:
    return {
        "model": model,
        "messages": request.messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # vLLM's extension: exactly max_tokens tokens
        "return_token_ids": True,  # vLLM's extension: a chunk per token, carrying its id
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def read_chunk(chunk: dict, record: RequestRecord) -> bool:
    """Fold one SSE chunk into the record; True when it carried tokens: token
    ids, new text or the finish (the opening chunk naming the role does not)."""
    usage = chunk.get("usage")
    if usage:
        record.output_tokens = usage.get("completion_tokens", 0)
        record.prompt_tokens = usage.get("prompt_tokens", 0)
        record.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    content, ids, finished = "", [], False
    for choice in chunk.get("choices") or []:
        content += (choice.get("delta") or {}).get("content") or ""
        ids += choice.get("token_ids") or []
        finished = finished or choice.get("finish_reason") is not None
    record.text += content
    record.token_ids += ids
    return bool(content or ids) or finished


async def stream_one(client: httpx.AsyncClient, request: Request, max_tokens: int, model: str) -> RequestRecord:
    """One client's request; TTFT is the first chunk carrying tokens (not the bare role chunk).

    A server that ignores ``return_token_ids`` streams text only; its chunks then
    hold whatever its detokenizer released, possibly several tokens each."""
    record = RequestRecord(request.index)
    start = last = time.perf_counter()
    seen_tokens = False
    try:
        async with client.stream("POST", "/v1/chat/completions",
                                 json=request_body(request, max_tokens, model)) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return record
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    break
                now = time.perf_counter()
                if read_chunk(json.loads(payload), record):
                    if seen_tokens:
                        record.itl.append(now - last)
                    else:
                        record.ttft, seen_tokens = now - start, True
                    last = now
    except httpx.HTTPError as err:
        record.error = f"{type(err).__name__}: {err}"
        return record
    record.latency = last - start
    if record.output_tokens != max_tokens:
        record.error = f"generated {record.output_tokens} tokens, expected {max_tokens}"
    return record


class LivePeak:
    """Polls /metrics for the pool's live blocks while a level runs."""

    def __init__(self, client: httpx.AsyncClient, interval: float) -> None:
        self.client = client
        self.interval = interval
        self.peak = 0.0

    async def run(self, done: asyncio.Event) -> None:
        while not done.is_set():
            response = await self.client.get("/metrics")
            self.peak = max(self.peak, parse_metrics(response.text).get(LIVE_BLOCKS, 0.0))
            try:
                await asyncio.wait_for(done.wait(), self.interval)
            except asyncio.TimeoutError:
                pass


class HttpArm:
    def __init__(self, name: str, url: str, *, scrape_metrics: bool, poll_interval: float = 0.25) -> None:
        self.name = name
        self.url = url.rstrip("/")
        self.scrape_metrics = scrape_metrics
        self.poll_interval = poll_interval
        self.model = httpx.get(f"{self.url}/v1/models", timeout=30).json()["data"][0]["id"]
        pool = httpx.get(f"{self.url}/v1/cascade", timeout=30).json()["snapshot"]["pool"] if scrape_metrics else {}
        self.bytes_per_block = pool.get("bytes_per_block", math.nan)
        self.kv_dtype = pool.get("kv_dtype", "")

    def run(self, workload: Workload, rep: int) -> ArmRun:
        return asyncio.run(self._run(workload, rep))

    async def _run(self, workload: Workload, rep: int) -> ArmRun:
        limits = httpx.Limits(max_connections=workload.concurrency + 4)
        async with httpx.AsyncClient(base_url=self.url, timeout=REQUEST_TIMEOUT, limits=limits) as client:
            before = await self._scrape(client)
            done = asyncio.Event()
            poller = LivePeak(client, self.poll_interval)
            polling = asyncio.ensure_future(poller.run(done)) if self.scrape_metrics else None
            start = time.perf_counter()
            records = await asyncio.gather(*(stream_one(client, r, workload.max_tokens, self.model)
                                             for r in workload.requests))
            duration = time.perf_counter() - start
            done.set()
            if polling is not None:
                await polling
            after = await self._scrape(client)
        run = ArmRun(self.name, workload.concurrency, rep, workload.variant, workload.shared_tokens,
                     list(records), duration, kv_dtype=self.kv_dtype)
        if self.scrape_metrics:
            split = launch_split(before, after)
            run.launches = split
            run.decode_seconds = split.decode_seconds
            # Each request's first token comes from its prefill step, the rest from decode steps.
            run.decode_tokens = sum(max(0, r.output_tokens - 1) for r in records if r.ok)
            run.peak_memory_bytes = after.get(PEAK_MEMORY, math.nan)
            run.kv_peak_bytes = poller.peak * self.bytes_per_block
        return run

    async def _scrape(self, client: httpx.AsyncClient) -> dict[str, float]:
        if not self.scrape_metrics:
            return {}
        return parse_metrics((await client.get("/metrics")).text)
