"""The requests of one benchmark level: N clients behind one identical system
prompt, each with its own short question, as chat messages and as token ids.

Every (level, rep) gets its own system-prompt variant, so a timed level never
finds its prompt already cached by an earlier one: the first client of each
level pays the shared prefill, and the warm-up (variant 0) warms the engine
without warming the prompt. The same variant number gives the same text in
every arm, so arms can be compared request by request.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from mlxcel.engine.corpus import TRAINING_CORPUS
from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS, DEFAULT_SYSTEM_PROMPT
from mlxcel.engine.sessions import tenant_system_prompts

WARMUP_VARIANT = 0


@dataclass(frozen=True)
class Request:
    index: int                  # the client's number within its level
    messages: list[dict]        # OpenAI chat messages: the shared system prompt, then the question
    token_ids: list[int]        # the same conversation through the chat template


@dataclass(frozen=True)
class Workload:
    variant: int
    requests: list[Request]
    max_tokens: int

    @property
    def concurrency(self) -> int:
        return len(self.requests)

    @property
    def shared_tokens(self) -> int:
        """Leading tokens every request has in common (the shared prefix as the engine sees it)."""
        return common_prefix_length([r.token_ids for r in self.requests])


def common_prefix_length(sequences: list[list[int]]) -> int:
    if not sequences:
        return 0
    length = 0
    for column in zip(*sequences):
        if any(token != column[0] for token in column):
            break
        length += 1
    return length


def text_of_tokens(tokenizer, source: str, num_tokens: int, start: int = 0) -> str:
    """About ``num_tokens`` tokens of ``source`` (repeated as needed) from token ``start`` on."""
    base = tokenizer.encode(source)
    return tokenizer.decode(list(itertools.islice(itertools.cycle(base), start, start + num_tokens)))


def system_prompt(tokenizer, num_tokens: int, variant: int) -> str:
    """A system prompt of about ``num_tokens`` tokens whose very first words name the variant."""
    tag = f"Context {variant}. "
    rest = max(0, num_tokens - len(tokenizer.encode(tag)))
    return tag + text_of_tokens(tokenizer, DEFAULT_SYSTEM_PROMPT, rest)


def question(tokenizer, index: int, num_tokens: int) -> str:
    """Client ``index``'s question, padded with corpus text to about ``num_tokens`` tokens."""
    text = f"Question {index}: {DEFAULT_QUESTIONS[index % len(DEFAULT_QUESTIONS)]}"
    missing = num_tokens - len(tokenizer.encode(text))
    if missing <= 0:
        return text
    return text + " " + text_of_tokens(tokenizer, TRAINING_CORPUS, missing, start=index * num_tokens)


def build_workload(tokenizer, *, shared_prefix_tokens: int, prompt_tokens: int, concurrency: int,
                   max_tokens: int, variant: int, tenants: int = 1, sub_prefix_tokens: int | None = None) -> Workload:
    """Client i sends tenant i mod ``tenants``'s system prompt (see
    engine.sessions.tenant_system_prompts) and its own question."""
    systems = tenant_system_prompts(tokenizer, system_prompt(tokenizer, shared_prefix_tokens, variant), tenants,
                                    sub_prefix_tokens)
    requests = []
    for index in range(concurrency):
        messages = [{"role": "system", "content": systems[index % tenants]},
                    {"role": "user", "content": question(tokenizer, index, prompt_tokens)}]
        ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        requests.append(Request(index, messages, ids))
    return Workload(variant, requests, max_tokens)


def level_variant(level_index: int, rep: int, reps: int) -> int:
    """The system-prompt variant of one timed (level, rep); never the warm-up's."""
    return WARMUP_VARIANT + 1 + level_index * reps + rep
