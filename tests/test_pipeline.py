"""The engine one step ahead of the device: step n+1 is launched before step
n's tokens are read, and what a client gets is exactly what a step-by-step
greedy loop gives (mlx-lm's own model, one sequence at a time): sequences
finishing at different steps, by length and by a stop token, cascade on and
off, a cancel mid-run."""

from __future__ import annotations

import threading

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from reliability import assert_pool_at_baseline

from mlxcel.engine.sequence import SamplingParams

MAX_TOKENS = (3, 7, 12, 20)


@pytest.fixture(scope="module")
def reference_model(tiny_model_path):
    return mlx_lm.load(str(tiny_model_path))[0]


def greedy(model, prompt, steps):
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[:, -1, :]
    tokens = []
    for _ in range(steps):
        tokens.append(int(mx.argmax(logits, axis=-1).item()))
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[:, -1, :]
    return tokens


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(11)
    shared = rng.integers(3, 1000, 70).tolist()
    return [shared + rng.integers(3, 1000, n).tolist() for n in (4, 9, 17, 30)]


@pytest.fixture(scope="module")
def references(reference_model, prompts):
    wanted = [greedy(reference_model, p, max(MAX_TOKENS)) for p in prompts]
    assert len({t for tokens in wanted for t in tokens}) > 5, "the fixture's greedy tokens must vary"
    return wanted


def submit_all(engine, prompts, params):
    streamed = {}

    def on_event(seq, token, reason):
        events = streamed.setdefault(seq.id, [])
        assert not events or events[-1][1] is None, "an event after the sequence finished"
        events.append((token, reason))

    return [engine.submit(p, prm, on_event) for p, prm in zip(prompts, params)], streamed


@pytest.mark.parametrize("cascade", [False, True])
def test_tokens_are_the_step_by_step_greedy_ones(make_engine, prompts, references, cascade):
    # The third sequence stops at a token it meets mid-run: the step after
    # that one is already on the device when the stop is read, and its token
    # must never reach the client.
    stop_at = references[2][5]
    expected_end = references[2].index(stop_at) + 1
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    params[2] = SamplingParams(max_tokens=MAX_TOKENS[2], ignore_eos=True, stop_token_ids=(stop_at,))
    engine = make_engine(enabled=cascade, min_shared_pages=2, block_size=16)
    seqs, streamed = submit_all(engine, prompts, params)
    engine.run_until_idle()
    for i, (seq, want) in enumerate(zip(seqs, references)):
        end = expected_end if i == 2 else MAX_TOKENS[i]
        assert seq.completion_token_ids == want[:end]
        assert seq.finish_reason == ("stop" if i == 2 else "length")
        tokens = [t for t, _ in streamed[seq.id] if t is not None]
        assert tokens == want[:end] and streamed[seq.id][-1][1] == seq.finish_reason
    launched = engine.metrics.registry.get_sample_value("mlxcel_paged_decode_launches_total", {"path": "cascade"})
    assert bool(launched) == cascade
    assert_pool_at_baseline(engine)


def test_a_cancel_mid_run_ends_one_sequence_and_no_other(make_engine, prompts, references):
    engine = make_engine(block_size=16)
    params = [SamplingParams(max_tokens=20, ignore_eos=True)] * len(prompts)
    seqs, streamed = submit_all(engine, prompts, params)
    while seqs[1].num_completion_tokens < 4:
        engine.step()
    engine.cancel(seqs[1])
    engine.run_until_idle()
    cancelled = seqs[1].completion_token_ids
    assert seqs[1].finish_reason == "cancelled" and 4 <= len(cancelled) < 20
    assert cancelled == references[1][:len(cancelled)]
    assert [t for t, _ in streamed[seqs[1].id] if t is not None] == cancelled
    for i in (0, 2, 3):
        assert seqs[i].completion_token_ids == references[i][:20] and seqs[i].finish_reason == "length"
    assert_pool_at_baseline(engine)


def test_each_decode_step_is_launched_before_the_previous_one_is_read(make_engine, prompts):
    engine = make_engine(block_size=16)
    pending_at_launch = []
    real = engine.runner.step

    def step(batch, last_tokens, settings):
        pending_at_launch.append([s.pending_tokens for s in batch.decode])
        return real(batch, last_tokens, settings)

    engine.runner.step = step
    engine.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    # After the first decode step every launch takes its inputs from the step
    # still on the device: the host never waited for them.
    full = [p for p in pending_at_launch if len(p) == len(prompts)]
    assert len(full) >= 8 and all(p == [1] * len(prompts) for p in full[1:])


def test_a_snapshot_is_read_while_mlx_runs_a_step(make_engine, prompts):
    # On the CPU MLX's async_eval runs most of a step before it returns (a prompt's chunk: seconds), so the
    # engine hands a built step to MLX outside its state lock: the dashboard's poll does not wait for it.
    engine = make_engine()
    entered, release = threading.Event(), threading.Event()
    real = engine.runner.launch

    def launch(launched):
        entered.set()
        assert release.wait(10)
        real(launched)

    engine.runner.launch = launch
    seq = engine.submit(prompts[0], SamplingParams(max_tokens=2, ignore_eos=True))
    stepper = threading.Thread(target=engine.step)
    stepper.start()
    assert entered.wait(10)
    read = []
    reader = threading.Thread(target=lambda: read.append(engine.snapshot))
    reader.start()
    reader.join(5)
    blocked = reader.is_alive()
    release.set()
    stepper.join(10)
    reader.join(10)
    assert not blocked, "the snapshot waited for MLX's step"
    assert [view.id for view in read[0].sequences] == [seq.id] and read[0].running == 1
    while engine.step():
        pass
    assert seq.num_completion_tokens == 2
    assert_pool_at_baseline(engine)


@pytest.mark.parametrize("part", ["step", "launch"])
def test_a_step_that_fails_ends_its_sequences_and_the_engine_goes_on(make_engine, prompts, part):
    # Building the graph (runner.step) or handing it to MLX (runner.launch) may raise: the step's sequences end
    # with finish reason "error", their pages go back, and the next request is served.
    engine = make_engine()
    real = getattr(engine.runner, part)

    def refused(*args):
        raise RuntimeError("refused")

    setattr(engine.runner, part, refused)
    seq = engine.submit(prompts[0], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    assert seq.is_finished and seq.finish_reason == "error"
    setattr(engine.runner, part, real)
    while engine.step():
        pass
    assert_pool_at_baseline(engine)
    again = engine.submit(prompts[0], SamplingParams(max_tokens=4, ignore_eos=True))
    while engine.step():
        pass
    assert again.num_completion_tokens == 4 and again.finish_reason == "length"


def test_a_long_prompt_prefills_beside_the_running_streams(make_engine, reference_model, prompts, references):
    # A token budget of 48: once three streams decode, a 700-token prompt is
    # computed 45 tokens a step beside them, and no stream ever skips a step.
    engine = make_engine(block_size=16, max_batched_tokens=48, max_running=4, num_blocks=256)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    running = [engine.submit(p, params) for p in prompts[:3]]
    while not all(s.num_completion_tokens for s in running):
        engine.step()
    rng = np.random.default_rng(5)
    long_prompt = rng.integers(3, 1000, 700).tolist()
    late = engine.submit(long_prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    counts, mixed = [], 0
    while late.num_completion_tokens == 0:
        before = [s.num_completion_tokens for s in running]
        engine.step()
        record = engine.snapshot.recent_steps[-1]
        if record.prefill_tokens and record.kind == "decode":
            mixed += 1
            assert record.tokens + record.prefill_tokens <= 48
        counts.append([s.num_completion_tokens - b for s, b in zip(running, before)])
    engine.run_until_idle()
    assert mixed >= 700 // 45 - 1, "the prompt was not prefilled beside the decodes"
    # Every step while it prefilled gave each unfinished stream its token.
    assert all(all(c == 1 for c, s in zip(step, running) if s.num_completion_tokens < 20) for step in counts[1:-1])
    for seq, want in zip(running, references[:3]):
        assert seq.completion_token_ids == want[:20]
    assert late.completion_token_ids == greedy(reference_model, long_prompt, 6)
    assert_pool_at_baseline(engine)
