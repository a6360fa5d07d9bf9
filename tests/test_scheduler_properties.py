"""Property-based: the engine's scheduler on a small pool under random
arrivals, cancels, completions and preemptions never leaks a block, frees one
twice, shares a page some sequence still writes, or hands a sequence another
one's tokens.

The model is a fake that records what a real one would write into the pool
(each position's token id) and checks, on every read, that a sequence's page
table yields exactly its own tokens. Its next token is a hash of the sequence
so far, so every request has one right answer however often it is preempted."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, \
    run_state_machine_as_test

import time

import mlx.core as mx

from mlxcel.engine.config import CascadeConfig, EngineConfig
from mlxcel.engine.decode_plan import FLAT, GATHER, DecodeOutcome
from mlxcel.engine.engine import Engine
from mlxcel.engine.runner import Launched
from mlxcel.engine.sampler import Sampled
from mlxcel.engine.scheduler import RequestRejected
from mlxcel.engine.sequence import SamplingParams, SequenceStatus

BLOCK = 4
NUM_BLOCKS = 12
MAX_DRAIN_STEPS = 2000  # far more than the requests left at the end of a run can need
VOCAB = 40  # small, so the fake emits EOS (ids 0 and 2) now and then
PREFIXES = [[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 20, 21, 22, 23], [30, 31, 32]]


def next_token(tokens: list[int]) -> int:
    return hash(tuple(tokens)) % VOCAB


def expected_completion(prompt: list[int], params: SamplingParams, eos: set[int]) -> tuple[list[int], str]:
    tokens = list(prompt)
    while True:
        token = next_token(tokens)
        tokens.append(token)
        if token in eos and not params.ignore_eos:
            return tokens[len(prompt):], "stop"
        if len(tokens) - len(prompt) >= params.max_tokens:
            return tokens[len(prompt):], "length"


class FakeRunner:
    """The model's contract with the pool, without the model: what it is given
    (a decode row's input may be the previous step's token, not yet on the
    host) and what it returns (tokens as an array, as a launched step does)."""

    def __init__(self, pool, sampler) -> None:
        self.pool = pool
        self.sampler = sampler
        self.slots: dict[tuple[int, int], int] = {}  # (block, offset) -> token id written there

    def _write(self, seq, tokens: list[int], start: int, end: int) -> None:
        assert len(seq.block_table) * BLOCK >= end, "the page table does not cover the tokens being written"
        for pos in range(start, end):
            self.slots[seq.block_table[pos // BLOCK], pos % BLOCK] = tokens[pos]

    def _read(self, seq, tokens: list[int], end: int) -> None:
        seen = [self.slots.get((seq.block_table[pos // BLOCK], pos % BLOCK)) for pos in range(end)]
        assert seen == tokens[:end], f"sequence {seq.id} reads another sequence's K/V"

    def step(self, batch, last_tokens, settings):
        out, outcomes = [], []
        if batch.decode:
            for seq, last in zip(batch.decode, last_tokens.tolist()):
                tokens = seq.token_ids + [last] * seq.pending_tokens   # the history as the model sees it
                assert tokens[-1] == last and seq.pending_tokens <= 1
                self._write(seq, tokens, seq.num_cached_tokens, seq.num_cached_tokens + 1)
                self._read(seq, tokens, seq.num_cached_tokens + 1)
                out.append(next_token(tokens))
            outcomes.append(DecodeOutcome(FLAT, len(batch.decode), None, 0, "fake"))
        if batch.prefill is not None:
            seq = batch.prefill
            assert seq.pending_tokens == 0 and batch.prefill_start == seq.num_cached_tokens
            self._write(seq, seq.token_ids, batch.prefill_start, batch.prefill_end)
            self._read(seq, seq.token_ids, batch.prefill_end)
            if batch.finishes_prefill:
                out.append(next_token(seq.token_ids))
            outcomes.append(DecodeOutcome(GATHER, 1, None, 0, "fake"))
        assert len(batch.decode) + batch.prefill_tokens <= 8, "the step is over its token budget"
        tokens = mx.array(out, dtype=mx.int32)
        return Launched(Sampled(tokens), tuple(outcomes), time.perf_counter(), (tokens,))

    def launch(self, launched):
        pass   # the tokens are made on the host: nothing for MLX to run


class SchedulerMachine(RuleBasedStateMachine):
    loaded = None  # set by the test: the tiny model gives the engine its geometry and tokenizer

    @initialize()
    def build(self):
        self.engine = Engine(self.loaded, EngineConfig(block_size=BLOCK, num_blocks=NUM_BLOCKS, max_running=4,
                                                       max_batched_tokens=8), cascade=CascadeConfig())
        self.engine.runner = FakeRunner(self.engine.pool, self.engine.runner.sampler)
        self.eos = set(self.engine.tokenizer.eos_token_ids)
        self.submitted = []  # (sequence, expected completion, expected reason)
        self.cancelled = set()

    @property
    def pool(self):
        return self.engine.pool

    def live_tables(self):
        return self.engine.scheduler.holders

    # -- rules ---------------------------------------------------------------

    @rule(prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(3, VOCAB - 1), max_size=14),
          max_tokens=st.integers(1, 30), ignore_eos=st.booleans())
    def submit(self, prefix, suffix, max_tokens, ignore_eos):
        prompt = prefix + suffix
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
        try:
            seq = self.engine.submit(prompt, params)
        except RequestRejected:
            assert -(-(len(prompt) + max_tokens) // BLOCK) > NUM_BLOCKS
            return
        self.submitted.append((seq, *expected_completion(prompt, params, self.eos)))

    @precondition(lambda self: self.submitted)
    @rule(data=st.data())
    def cancel(self, data):
        seq = data.draw(st.sampled_from([s for s, _, _ in self.submitted]))
        self.cancelled.add(seq.id)
        self.engine.cancel(seq)

    @rule(steps=st.integers(1, 6))
    def step(self, steps):
        for _ in range(steps):
            self.engine.step()

    # -- invariants ------------------------------------------------------------

    @invariant()
    def refcounts_match_the_page_tables(self):
        holders = Counter()
        for seq in self.live_tables():
            assert len(set(seq.block_table)) == len(seq.block_table), "a page table names a block twice"
            holders.update(seq.block_table)
        assert [holders[b] for b in range(NUM_BLOCKS)] == self.pool.refcount

    @invariant()
    def every_block_is_live_free_or_kept_exactly_once(self):
        free, kept = list(self.pool.free), list(self.pool.reusable)
        live = [b for b in range(NUM_BLOCKS) if self.pool.refcount[b] > 0]
        assert sorted(free + kept + live) == list(range(NUM_BLOCKS))
        assert all(self.pool.keep_on_release(b) for b in kept), "a kept block the prefix cache does not know"

    @invariant()
    def only_full_cached_pages_are_shared(self):
        for seq in self.live_tables():
            for i, block in enumerate(seq.block_table):
                if self.pool.refcount[block] > 1:
                    assert self.pool.keep_on_release(block) and (i + 1) * BLOCK <= seq.num_cached_tokens, \
                        f"block {block} is shared while sequence {seq.id} still writes it"

    @invariant()
    def a_sequence_never_has_two_tokens_on_their_way(self):
        assert all(seq.pending_tokens in (0, 1) for seq, _, _ in self.submitted)

    @invariant()
    def waiting_and_finished_sequences_hold_nothing(self):
        for seq, _, _ in self.submitted:
            if seq.status is not SequenceStatus.RUNNING:
                assert seq.block_table == []

    @invariant()
    def every_finished_sequence_got_its_own_answer(self):
        for seq, completion, reason in self.submitted:
            if seq.is_finished:
                assert seq.finish_reason != "error"
                if seq.id not in self.cancelled:
                    assert (seq.completion_token_ids, seq.finish_reason) == (completion, reason)
                else:
                    assert seq.finish_reason == "cancelled" or seq.completion_token_ids == completion

    def teardown(self):
        if not hasattr(self, "engine"):
            return
        self.engine.run_until_idle(max_steps=MAX_DRAIN_STEPS)  # bounded: a leak must fail, not hang
        for seq, completion, reason in self.submitted:
            assert seq.is_finished, f"sequence {seq.id} never finished"
        self.refcounts_match_the_page_tables()
        assert self.pool.num_live == 0 and not any(self.pool.refcount)


def test_scheduler_and_pool_state_machine(tiny_loaded):
    SchedulerMachine.loaded = tiny_loaded
    run_state_machine_as_test(SchedulerMachine, settings=settings(
        max_examples=50, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
