"""Per-request sampling values must not recompile the sampler: mlx_lm's
apply_top_p is mx.compile'd, and a Python float argument is baked into the
compiled graph, so each new top_p cost a ~2 s compile on the engine thread
(every session stalled) and grew the compile cache for good."""

from __future__ import annotations

import mlx.core as mx

from mlxcel.engine import sampler as sampler_module
from mlxcel.engine.sequence import SamplingParams


def test_top_p_reaches_the_compiled_function_as_an_array(make_engine, monkeypatch):
    seen = []
    real = sampler_module.apply_top_p

    def spy(logprobs, top_p):
        seen.append(top_p)
        return real(logprobs, top_p)

    monkeypatch.setattr(sampler_module, "apply_top_p", spy)
    engine = make_engine(num_blocks=8)
    for top_p in (0.5, 0.61, 0.7237, 0.9):
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=2, temperature=1.0, top_p=top_p, seed=1))
    assert len(seen) == 8
    assert all(isinstance(value, mx.array) and value.shape == () for value in seen)
    assert [round(value.item(), 4) for value in seen[::2]] == [0.5, 0.61, 0.7237, 0.9]
