"""Built-in sessions over several tenants: their system prompts, and the
forest of spans the engine plans for them, live (the embedded model)."""

from __future__ import annotations

import pytest

from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS, DEFAULT_SYSTEM_PROMPT
from mlxcel.engine.sessions import SessionManager, synthetic_system_prompt, tenant_system_prompts


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_tenant_prompts_share_what_they_say(tiny_loaded):
    tokenizer = tiny_loaded.tokenizer
    common = synthetic_system_prompt(tokenizer, 200, DEFAULT_SYSTEM_PROMPT)
    assert tenant_system_prompts(tokenizer, common, 1, None) == [common]
    disjoint = [tokenizer.encode(p) for p in tenant_system_prompts(tokenizer, common, 3, None)]
    assert len(set(map(tuple, disjoint))) == 3 and all(common_prefix(disjoint[0], d) < 8 for d in disjoint[1:])
    nested = [tokenizer.encode(p) for p in tenant_system_prompts(tokenizer, common, 3, 64)]
    shared = len(tokenizer.encode(common))
    for other in nested[1:]:
        assert shared - 2 <= common_prefix(nested[0], other) < shared + 8    # the common part, then apart
    assert all(len(p) >= shared + 60 for p in nested)
    with pytest.raises(ValueError):
        tenant_system_prompts(tokenizer, common, 0, None)


def run_sessions(make_engine, tiny_loaded, *, enabled, tenants, sub_prefix_tokens, count=6):
    engine = make_engine(enabled=enabled, min_shared_pages=2, block_size=16)
    common = synthetic_system_prompt(tiny_loaded.tokenizer, 96, DEFAULT_SYSTEM_PROMPT)
    prompts = tenant_system_prompts(tiny_loaded.tokenizer, common, tenants, sub_prefix_tokens)
    sessions = SessionManager(engine, prompts, list(DEFAULT_QUESTIONS), max_tokens=12, turns=1)
    sessions.add(count)
    plans = []
    while engine.step():
        plans.append(engine.snapshot.plan)
    return [s.completions for s in sessions.sessions], [p for p in plans if p is not None]


@pytest.mark.parametrize("tenants, sub_prefix_tokens, groups, depth", [(2, None, 2, 1), (3, 64, 1, 2)])
def test_sessions_over_tenants_cascade_as_a_forest_with_the_same_tokens(make_engine, tiny_loaded, tenants,
                                                                        sub_prefix_tokens, groups, depth):
    on, plans = run_sessions(make_engine, tiny_loaded, enabled=True, tenants=tenants,
                             sub_prefix_tokens=sub_prefix_tokens)
    off, _ = run_sessions(make_engine, tiny_loaded, enabled=False, tenants=tenants,
                          sub_prefix_tokens=sub_prefix_tokens)
    assert on == off and any(len(set(c[0])) > 1 for c in on)       # the same tokens, and they vary
    full = [p for p in plans if len({m for s in p.spans for m in s.members}) == 6]
    assert full, "no decode step had every session in a span"
    plan = full[-1]
    assert len({s.group for s in plan.spans}) == groups and max(s.depth for s in plan.spans) + 1 == depth
    if depth == 2:                                   # one span for everyone, one per tenant below it
        inner = [s for s in plan.spans if s.depth == 1]
        assert len(inner) == tenants and sorted(len(s.members) for s in inner) == [2, 2, 2]
        outer = next(s for s in plan.spans if s.depth == 0)
        assert all(s.start == outer.end for s in inner) and outer.tokens == outer.end * 16
