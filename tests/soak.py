"""A bounded soak on loopback: many streaming chat clients behind one system
prompt, some hanging up at random points, for a fixed number of requests.
Reports what happened; tests/test_soak.py decides whether it was good."""

from __future__ import annotations

import asyncio
import gc
import random
from collections import Counter
from dataclasses import dataclass, field

import httpx
import psutil
from reliability import check_stream, sse_events

from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS


@dataclass(frozen=True)
class SoakPlan:
    clients: int = 64
    requests: int = 128
    warmup: int = 128           # requests before the RSS baseline is taken; RSS is also sampled every `warmup`
    disconnect_share: float = 1 / 3
    max_tokens: int = 6
    seed: int = 0


@dataclass
class SoakReport:
    completed: int = 0          # streams read to [DONE], each checked well formed
    disconnected: int = 0       # streams the client hung up on before [DONE]
    malformed: list[str] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)  # HTTP status -> responses
    rss_warm: int = 0           # bytes, after warm-up
    rss_end: int = 0
    rss_peak: int = 0
    rss_checkpoints: list[int] = field(default_factory=list)  # after every `warmup` more requests

    @property
    def rss_drift(self) -> int:
        return self.rss_end - self.rss_warm


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


async def one_request(client: httpx.AsyncClient, body: dict, hang_up_after: int | None, report: SoakReport):
    """Read one stream to [DONE] and check it, or hang up after `hang_up_after` data lines."""
    lines = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        report.statuses[response.status_code] += 1
        async for line in response.aiter_lines():
            if line:
                lines.append(line)
            if line == "data: [DONE]":
                break
            if hang_up_after is not None and len(lines) >= hang_up_after:
                report.disconnected += 1
                return  # leaving the block closes the connection mid-stream
    try:
        check_stream(sse_events(lines))
        report.completed += 1
    except (AssertionError, ValueError, KeyError) as err:
        report.malformed.append(f"{err!r}: {lines[-3:]}")


async def soak(base: str, system_prompt: str, plan: SoakPlan) -> SoakReport:
    rng = random.Random(plan.seed)
    report = SoakReport()
    todo = iter(range(plan.requests))
    limits = httpx.Limits(max_connections=plan.clients + 8, max_keepalive_connections=plan.clients)

    def next_job():
        n = next(todo, None)
        if n is None:
            return None
        question = DEFAULT_QUESTIONS[n % len(DEFAULT_QUESTIONS)]
        body = {"messages": [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}],
                "max_tokens": plan.max_tokens, "temperature": 0, "stream": True}
        hang_up = rng.randrange(plan.max_tokens + 1) if rng.random() < plan.disconnect_share else None
        return n, body, hang_up

    async def client_loop(client):
        while (job := next_job()) is not None:
            n, body, hang_up = job
            await one_request(client, body, hang_up, report)
            if n and n % plan.warmup == 0:
                report.rss_checkpoints.append(rss())
            if n == plan.warmup:
                report.rss_warm = report.rss_checkpoints[-1]
            report.rss_peak = max(report.rss_peak, psutil.Process().memory_info().rss)

    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(plan.clients)))
    report.rss_end = rss()
    return report
