"""Sampling fields in the engine against a float64 NumPy reference built on
mlx-lm's own model: logit bias, the three penalties (their context includes
the token still on the device when the next step is built), logprobs with
their top tokens, top-k and min-p. Requests with different fields share each
batched step, so a row's processors must not leak into another's."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from mlxcel.engine.sequence import SamplingParams

# The engine's logits match mlx-lm's within 2e-4 (tests/test_engine.py says
# why); a log-softmax moves by at most twice that.
LOGPROB_ATOL = 4e-4
STEPS = 12


@pytest.fixture(scope="module")
def reference(tiny_model_path):
    model, _ = mlx_lm.load(str(tiny_model_path))
    return model


def reference_logits(model, prompt: list[int], completion: list[int]) -> np.ndarray:
    """Float64 logits mlx-lm's model gives at each generated position, teacher-forced."""
    logits = model(mx.array([prompt + completion]))[0, len(prompt) - 1:-1].astype(mx.float32)
    return np.array(logits, dtype=np.float64)


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def penalised(logits: np.ndarray, history: list[int], p: SamplingParams) -> np.ndarray:
    """mlx-lm's documented penalties, in NumPy: each over the last *_context_size tokens, prompt included."""
    x = logits.copy()
    for token, bias in p.logit_bias:
        x[token] += bias
    if p.repetition_penalty:
        for t in set(history[-p.repetition_context_size:]):
            x[t] = x[t] * p.repetition_penalty if x[t] < 0 else x[t] / p.repetition_penalty
    if p.presence_penalty:
        for t in set(history[-p.presence_context_size:]):
            x[t] -= p.presence_penalty
    if p.frequency_penalty:
        for t in history[-p.frequency_context_size:]:
            x[t] -= p.frequency_penalty
    return x


def greedy_reference(model, prompt: list[int], p: SamplingParams, steps: int) -> list[int]:
    tokens = []
    for _ in range(steps):
        logits = np.array(model(mx.array([prompt + tokens]))[0, -1].astype(mx.float32), dtype=np.float64)
        tokens.append(int(np.argmax(penalised(logits, prompt + tokens, p))))
    return tokens


def run_together(engine, requests: list[tuple[list[int], SamplingParams]]):
    seqs = [engine.submit(prompt, params) for prompt, params in requests]
    engine.run_until_idle()
    return seqs


def prompts(n: int, length: int = 24) -> list[list[int]]:
    rng = np.random.default_rng()
    return [[int(t) for t in rng.integers(3, 1000, length)] for _ in range(n)]


def test_penalties_and_bias_match_the_reference_in_one_batch(make_engine, reference):
    """A bias makes one token win every step; each penalty must stop the repeat
    where the reference says, so its window (and the in-flight token in it) is right."""
    def params(**fields):
        return SamplingParams(max_tokens=STEPS, ignore_eos=True, **fields)

    # Logits spread over about [-7, 7] here: +20 wins whatever the token's own logit.
    bias = {"logit_bias": ((17, 20.0),)}
    requests = [params(**bias, presence_penalty=40.0, presence_context_size=5),
                params(**bias, frequency_penalty=8.0, frequency_context_size=6),
                params(**bias, repetition_penalty=10.0, repetition_context_size=3),
                params(logit_bias=((29, -50.0),)),
                params()]
    batch = prompts(len(requests))
    seqs = run_together(make_engine(), list(zip(batch, requests)))
    for prompt, p, seq in zip(batch, requests, seqs):
        assert seq.completion_token_ids == greedy_reference(reference, prompt, p, STEPS), p
        assert len(set(seq.completion_token_ids)) > 1          # greedy tokens that vary
    repeated = make_engine().generate(batch[:3], params(**bias))
    assert repeated == [[17] * STEPS] * 3                      # without a penalty, the biased token every step
    for seq in seqs[:3]:
        assert 1 < seq.completion_token_ids.count(17) < STEPS  # back once out of the penalty's window
    assert 29 not in seqs[3].completion_token_ids


def test_logit_bias_forces_a_token_at_any_temperature(make_engine):
    engine = make_engine()
    forced = 123
    params = [SamplingParams(max_tokens=8, ignore_eos=True, temperature=t, seed=3, logit_bias=((forced, 100.0),))
              for t in (0.0, 1.0, 2.0)]
    batch = prompts(3)
    seqs = run_together(engine, list(zip(batch, params)))
    assert all(s.completion_token_ids == [forced] * 8 for s in seqs)
    free = engine.generate([batch[0]], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert forced not in free


def test_logprobs_are_the_models_log_softmax_top_first(make_engine, reference):
    engine = make_engine()
    batch = prompts(3)
    requests = [(batch[0], SamplingParams(max_tokens=STEPS, ignore_eos=True, logprobs=5)),
                (batch[1], SamplingParams(max_tokens=STEPS, ignore_eos=True, temperature=1.0, seed=7, logprobs=2)),
                (batch[2], SamplingParams(max_tokens=STEPS, ignore_eos=True, logprobs=0))]
    seqs = run_together(engine, requests)
    for (prompt, p), seq in zip(requests, seqs):
        want = log_softmax(reference_logits(reference, prompt, seq.completion_token_ids))
        assert len(seq.logprobs) == STEPS
        for step, (token, entry) in enumerate(zip(seq.completion_token_ids, seq.logprobs)):
            assert entry.logprob == pytest.approx(want[step, token], abs=LOGPROB_ATOL)
            assert len(entry.top) == p.logprobs
            values = [lp for _, lp in entry.top]
            assert values == sorted(values, reverse=True)
            np.testing.assert_allclose(values, np.sort(want[step])[::-1][:p.logprobs], atol=LOGPROB_ATOL)
            for t, lp in entry.top:
                assert lp == pytest.approx(want[step, t], abs=LOGPROB_ATOL)
            if p.temperature == 0 and p.logprobs:
                assert entry.top[0][0] == token
    assert len(set(seqs[1].completion_token_ids)) > 1


def test_top_k_and_min_p_keep_only_the_likely_tokens(make_engine, reference):
    engine = make_engine()
    batch = prompts(3)
    hot = dict(max_tokens=24, ignore_eos=True, temperature=2.0, seed=11)
    requests = [(batch[0], SamplingParams(**hot, top_k=3)), (batch[1], SamplingParams(**hot, min_p=0.5)),
                (batch[2], SamplingParams(**hot))]
    seqs = run_together(engine, requests)
    ranks, ratios = [], []
    for (prompt, _), seq in zip(requests, seqs):
        lp = log_softmax(reference_logits(reference, prompt, seq.completion_token_ids))
        tokens = seq.completion_token_ids
        ranks.append([int((lp[i] > lp[i, t]).sum()) for i, t in enumerate(tokens)])
        ratios.append([float(np.exp(lp[i, t] - lp[i].max())) for i, t in enumerate(tokens)])
    assert max(ranks[0]) < 3
    assert min(ratios[1]) >= 0.5 - 1e-3
    # Unfiltered at this temperature, some token falls outside both.
    assert max(ranks[2]) >= 3 and min(ratios[2]) < 0.5
