"""Continuous batching over the pool: who prefills, who decodes, who waits.

Every step carries every running sequence's next token and, within a token
budget (``max_batched_tokens``, as vLLM's chunked prefill), a chunk of the one
sequence that is prefilling: a long prompt is computed a budget at a time
beside the decodes, so running streams keep their pace. The prefilling
sequence adopts the prefix cache when its prefill starts, so sessions
arriving together behind one system prompt compute it once. When a step
needs a page the pool cannot give, the most recently admitted sequence is
preempted back to the queue and recomputed later.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .pool import PoolExhausted
from .prefix_cache import PrefixCache
from .sequence import Sequence, SequenceStatus


class RequestRejected(ValueError):
    """A request that can never run on this engine; the message says why."""


@dataclass
class ScheduledStep:
    decode: list[Sequence]             # one new token each
    prefill: Sequence | None = None    # and a chunk of this one's prompt: positions [prefill_start, prefill_end)
    prefill_start: int = 0
    prefill_end: int = 0
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """"decode" for a step with decode rows (a prefill chunk may ride along), else "prefill"."""
        return "decode" if self.decode else "prefill"

    @property
    def seqs(self) -> list[Sequence]:
        return self.decode + ([self.prefill] if self.prefill else [])

    @property
    def prefill_tokens(self) -> int:
        return self.prefill_end - self.prefill_start

    @property
    def finishes_prefill(self) -> bool:
        return self.prefill is not None and self.prefill_end == len(self.prefill)


class Scheduler:
    def __init__(self, cache: PrefixCache, max_running: int = 64, max_batched_tokens: int = 512) -> None:
        if max_batched_tokens <= max_running:
            raise ValueError(f"max_batched_tokens ({max_batched_tokens}) must exceed max_running ({max_running}): "
                             "a step carries every running sequence's token and room for a prefill chunk")
        self.cache = cache
        self.pool = cache.pool
        self.max_running = max_running
        self.max_batched_tokens = max_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.prefilling: Sequence | None = None
        # Out of the running set, holding their pages until their last token
        # (already on its way from a launched step) is read back.
        self.retiring: list[Sequence] = []
        self.num_preemptions = 0

    def check(self, num_tokens: int) -> None:
        """Refuse a sequence that could not fit even in an empty pool."""
        needed = -(-num_tokens // self.pool.block_size)
        if needed > self.pool.num_blocks:
            raise RequestRejected(f"{num_tokens} tokens need {needed} KV blocks; "
                                  f"the pool holds {self.pool.num_blocks}")

    def add(self, seq: Sequence) -> None:
        """Queue a sequence that passed check()."""
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.prefilling or self.retiring)

    @property
    def holders(self) -> list[Sequence]:
        """Every sequence holding pages."""
        return ([self.prefilling] if self.prefilling else []) + self.running + self.retiring

    def _admit(self) -> None:
        if self.prefilling or not self.waiting or len(self.running) >= self.max_running:
            return
        seq = self.waiting[0]
        self.cache.adopt(seq)
        # Keep one page of headroom per running sequence so admitting a prompt
        # does not immediately preempt the decoders.
        if self.cache.blocks_needed(seq, len(seq)) + len(self.running) > self.pool.num_available:
            self.cache.release(seq)
            return
        self.cache.extend(seq, len(seq))
        self.waiting.popleft()
        seq.status = SequenceStatus.RUNNING
        self.prefilling = seq

    def _preempt(self, seq: Sequence) -> None:
        self.cache.release(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _reserve_decode_pages(self) -> list[Sequence]:
        preempted = []
        for seq in list(self.running):
            while seq in self.running:
                try:
                    self.cache.extend(seq, seq.num_cached_tokens + 1)
                    break
                except PoolExhausted:
                    victim = self.running[-1]
                    self._preempt(victim)
                    preempted.append(victim)
        return preempted

    def schedule(self) -> ScheduledStep | None:
        self._admit()
        preempted = self._reserve_decode_pages()
        step = ScheduledStep(list(self.running), preempted=preempted)
        if self.prefilling:
            seq = self.prefilling
            budget = self.max_batched_tokens - len(step.decode)
            step.prefill, step.prefill_start = seq, seq.num_cached_tokens
            step.prefill_end = min(len(seq), seq.num_cached_tokens + budget)
        return step if step.decode or step.prefill else None

    def prefill_done(self, seq: Sequence) -> None:
        self.prefilling = None
        self.running.append(seq)

    def retire(self, seq: Sequence) -> None:
        """Schedule no more steps for a running sequence whose last token is
        on its way; it keeps its pages until it is removed."""
        if seq in self.running:
            self.running.remove(seq)
            self.retiring.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out wherever it is and release its pages."""
        if seq is self.prefilling:
            self.prefilling = None
        elif seq in self.running:
            self.running.remove(seq)
        elif seq in self.retiring:
            self.retiring.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.cache.release(seq)
