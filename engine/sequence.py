"""One request's sequence: its tokens, its page table and where it stands."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    id: int = field(default_factory=lambda: next(_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    # Page table: block ids in position order; only the last page may be partial.
    block_table: list[int] = field(default_factory=list)
    # Bumped whenever block_table changes, so page-table views can be reused.
    table_version: int = 0
    # Tokens whose K/V are in the pool (adopted from the prefix cache or computed).
    num_cached_tokens: int = 0
    # Tokens adopted from the prefix cache at the last admission.
    num_reused_tokens: int = 0
    # Tokens sampled by a launched step but not yet read back into token_ids
    # (the engine enqueues the next step before reading this one's tokens).
    pending_tokens: int = 0
    # Prefix-cache chain of this sequence's full blocks: (hash, entry uid, None if unindexable).
    block_chain: list[tuple[int, int | None]] = field(default_factory=list)
    finish_reason: str | None = None
    label: str = ""

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def set_table(self, table: list[int]) -> None:
        self.block_table = table
        self.table_version += 1
