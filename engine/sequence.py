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
    """One request's sampling, as mlx-lm's server takes it (mlx_lm.sample_utils
    does the work). A penalty looks at the sequence's last ``*_context_size``
    tokens, prompt included, as mlx-lm's do; None or 0 leaves it out."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0                      # 0: every token
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, added to its logit)
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    presence_penalty: float | None = None
    presence_context_size: int = 20
    frequency_penalty: float | None = None
    frequency_context_size: int = 20
    logprobs: int | None = None          # None: none; n: each token's log-probability and the n likeliest

    @property
    def has_processors(self) -> bool:
        """Whether the logits are changed before sampling (bias, penalties)."""
        return bool(self.logit_bias or self.repetition_penalty or self.presence_penalty
                    or self.frequency_penalty)


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability and the likeliest tokens at its step,
    most likely first: log-softmax of the logits the sampler drew from (after
    bias and penalties, before temperature and the top-k/top-p/min-p filters,
    as mlx-lm reports them)."""

    logprob: float
    top: tuple[tuple[int, float], ...]


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
    # One per generated token when params.logprobs is set.
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # perf_counter times: submitted, first scheduled, first and latest token read.
    submitted_at: float = 0.0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None

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
