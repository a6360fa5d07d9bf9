"""The soak on loopback (tests/soak.py): every completed stream is well formed,
every request finishes exactly once, RSS stays flat after warm-up, and no
block is left held. The suite runs a short version; scale it with
MLXCEL_SOAK_REQUESTS (and MLXCEL_SOAK_CLIENTS, MLXCEL_SOAK_MAX_TOKENS), e.g.

    MLXCEL_SOAK_REQUESTS=2000 .venv/bin/pytest tests/test_soak.py -s
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from reliability import assert_pool_at_baseline, wait_until
from serving import running_server
from soak import SoakPlan, soak

from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.engine import Engine
from mlxcel.engine.sessions import synthetic_system_prompt
from mlxcel.engine.session_prompts import DEFAULT_SYSTEM_PROMPT

MIB = 2**20
# RSS after warm-up may grow by this much at most. MLX's buffers for the batch
# shapes met settle in the first ~128 requests (about +10 MiB, seen by the
# short run whose warm-up is 64); after that a 1024-request run moves < 1 MiB.
RSS_DRIFT_BOUND = 32 * MIB
SYSTEM_PROMPT = ("You are the shared system prompt of a soak test. Every client sends these words first, "
                 "so their pages are held once by the prefix cache and adopted by each request. ") * 2


def plan_from_env() -> SoakPlan:
    env = os.environ
    requests = int(env.get("MLXCEL_SOAK_REQUESTS", 128))
    return SoakPlan(clients=int(env.get("MLXCEL_SOAK_CLIENTS", 64)), requests=requests,
                    warmup=min(128, requests // 2), max_tokens=int(env.get("MLXCEL_SOAK_MAX_TOKENS", 6)))


def sample(engine, name, **labels):
    return engine.metrics.registry.get_sample_value(name, labels) or 0


def test_soak_many_streaming_clients_with_disconnects(tiny_loaded):
    plan = plan_from_env()
    engine = Engine(tiny_loaded, EngineConfig(num_blocks=512), cascade=CascadeConfig(True, 2, 2))
    started = time.monotonic()
    with running_server(engine) as (base, server):
        report = asyncio.run(soak(base, SYSTEM_PROMPT, plan))
        assert wait_until(lambda: not engine.scheduler.has_work and engine.pool.num_live == 0, timeout=30)
        seconds = time.monotonic() - started
        finished = {reason: sample(engine, "mlxcel_requests_total", finish_reason=reason)
                    for reason in ("stop", "length", "cancelled", "error")}
        cached = engine.cache.stats().cached_blocks
        reused = sample(engine, "mlxcel_prompt_cache_prefix_tokens_reused_total")
        assert_pool_at_baseline(engine)
    print(f"\nsoak: {plan.clients} clients, {plan.requests} requests, {report.completed} completed, "
          f"{report.disconnected} disconnected ({finished['cancelled']:.0f} cancelled by the engine), "
          f"RSS {report.rss_warm / MIB:.1f} MiB after warm-up -> {report.rss_end / MIB:.1f} MiB at the end "
          f"(drift {report.rss_drift / MIB:+.1f} MiB, peak {report.rss_peak / MIB:.1f} MiB), "
          f"leaked blocks {engine.pool.num_live}, prefix-cache blocks kept {cached}, "
          f"prompt tokens reused {reused:.0f}, {seconds:.1f} s; RSS every {plan.warmup} requests (MiB): "
          f"{[round(r / MIB, 1) for r in report.rss_checkpoints]}")

    assert report.malformed == []
    assert report.completed + report.disconnected == plan.requests
    assert report.disconnected >= plan.requests // 5, "the plan meant about a third to hang up"
    assert finished["error"] == 0
    assert sum(finished.values()) == plan.requests, "every request finishes exactly once"
    assert finished["cancelled"] <= report.disconnected
    assert reused > 0, "the system prompt's pages were shared"
    assert report.rss_drift < RSS_DRIFT_BOUND


STORM_ROUNDS = 6
STORM_RSS_BOUND = 10 * MIB


@pytest.mark.slow
def test_disconnect_storm_rounds_leak_nothing(tiny_loaded):
    """Six rounds of streams behind one system prompt, a third hanging up: after
    each round no block is held and nothing got a 5xx; RSS after the rounds
    stays within 10 MiB of the first's. The suite runs 16 streams behind 512
    tokens; the issue's storm (64 behind 2048, about two minutes here) is

        MLXCEL_STORM_CLIENTS=64 MLXCEL_STORM_PREFIX_TOKENS=2048 .venv/bin/pytest tests/test_soak.py -k storm -s
    """
    clients = int(os.environ.get("MLXCEL_STORM_CLIENTS", 16))
    prefix_tokens = int(os.environ.get("MLXCEL_STORM_PREFIX_TOKENS", 512))
    engine = Engine(tiny_loaded, EngineConfig(num_blocks=1024), cascade=CascadeConfig(True, 2, 2))
    system_prompt = synthetic_system_prompt(engine.tokenizer, prefix_tokens, DEFAULT_SYSTEM_PROMPT)
    rounds = []
    started = time.monotonic()
    with running_server(engine) as (base, server):
        for n in range(STORM_ROUNDS):
            plan = SoakPlan(clients=clients, requests=clients, warmup=clients, max_tokens=4, seed=n)
            report = asyncio.run(soak(base, system_prompt, plan))
            assert wait_until(lambda: not engine.scheduler.has_work and engine.pool.num_live == 0, timeout=30)
            assert_pool_at_baseline(engine)
            assert report.malformed == [] and not [s for s in report.statuses if s >= 500], report.statuses
            assert report.completed + report.disconnected == clients
            rounds.append(report.rss_end)
    print(f"\nstorm: {STORM_ROUNDS} rounds of {clients} streams behind {len(engine.tokenizer.encode(system_prompt))} "
          f"prompt tokens, RSS after each (MiB): {[round(r / MIB, 1) for r in rounds]}, "
          f"{time.monotonic() - started:.1f} s")
    assert max(rounds) - rounds[0] < STORM_RSS_BOUND
