"""Pool exhaustion under load: requests wait, or are preempted and recomputed;
every one still completes with exactly the tokens it gets when run alone."""

from __future__ import annotations

import pytest
from reliability import assert_pool_at_baseline, wait_until

from mlxcel.engine.sequence import SamplingParams

BLOCK = 8
SHARED = [40 + i for i in range(2 * BLOCK)]  # two shared pages
PROMPTS = [SHARED + [100 + 7 * r + i for i in range(3 + r)] for r in range(5)]
PARAMS = SamplingParams(max_tokens=14, temperature=0, ignore_eos=True)  # 3 or 4 pages per request


@pytest.fixture(scope="module")
def alone(tiny_loaded):
    """Each prompt's greedy completion on a roomy engine, one request at a time."""
    from mlxcel.engine.config import CascadeConfig, EngineConfig
    from mlxcel.engine.engine import Engine

    engine = Engine(tiny_loaded, EngineConfig(block_size=BLOCK, num_blocks=64), cascade=CascadeConfig())
    return [engine.generate([p], PARAMS)[0] for p in PROMPTS]


def test_exhausted_pool_preempts_and_recomputes_exactly(make_engine, alone):
    engine = make_engine(block_size=BLOCK, num_blocks=7)
    seqs = [engine.submit(p, PARAMS) for p in PROMPTS]
    engine.run_until_idle()
    assert engine.scheduler.num_preemptions > 0, "the pool was meant to run out"
    assert [s.finish_reason for s in seqs] == ["length"] * len(seqs)
    assert [s.completion_token_ids for s in seqs] == alone
    assert all(len(set(tokens)) > 1 for tokens in alone)
    assert_pool_at_baseline(engine)


def test_running_engine_under_exhaustion_serves_every_request(make_engine, alone):
    engine = make_engine(block_size=BLOCK, num_blocks=10)  # room for two or three requests at once
    finished = {}
    seqs = [engine.submit(p, PARAMS, lambda seq, token, reason: reason and finished.setdefault(seq.id, reason))
            for p in PROMPTS]
    engine.start()
    assert wait_until(lambda: len(finished) == len(seqs), timeout=60)
    engine.stop()
    assert set(finished.values()) == {"length"}
    assert [s.completion_token_ids for s in seqs] == alone
    assert engine.metrics.registry.get_sample_value("mlxcel_preemptions_total") > 0
    assert_pool_at_baseline(engine)
