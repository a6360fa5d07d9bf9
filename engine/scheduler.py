"""Continuous batching over the pool: who prefills, who decodes, who waits.

One sequence prefills at a time, in chunks, and adopts the prefix cache when
its prefill starts, so sessions arriving together behind one system prompt
compute it once. Decode steps batch every running sequence. When a decode
step needs a page the pool cannot give, the most recently admitted sequence
is preempted back to the queue and recomputed later.
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
    kind: str  # "prefill" or "decode"
    seqs: list[Sequence]
    prefill_start: int = 0
    prefill_end: int = 0
    preempted: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(self, cache: PrefixCache, max_running: int = 64, prefill_chunk: int = 512) -> None:
        self.cache = cache
        self.pool = cache.pool
        self.max_running = max_running
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.prefilling: Sequence | None = None
        # Out of the running set, holding their pages until their last token
        # (already on its way from a launched step) is read back.
        self.retiring: list[Sequence] = []
        self.num_preemptions = 0
        self._last_kind = ""

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
        prefill_turn = self.prefilling and (not self.running or self._last_kind == "decode")
        if not prefill_turn and self.running:
            preempted = self._reserve_decode_pages()
            if self.running:
                self._last_kind = "decode"
                return ScheduledStep("decode", list(self.running), preempted=preempted)
        if self.prefilling:
            seq = self.prefilling
            self._last_kind = "prefill"
            end = min(len(seq), seq.num_cached_tokens + self.prefill_chunk)
            return ScheduledStep("prefill", [seq], seq.num_cached_tokens, end)
        return None

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
