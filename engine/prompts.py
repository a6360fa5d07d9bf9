"""A request's prompt to token ids: bounded before any work, tokenized off the
event loop, memory handed back after.

Tokenizing is the work a request makes the server do before the engine sees
it, and it grows with the text: a 4 MB prompt took seconds and hundreds of
MiB. No token covers more characters than the vocabulary's longest entry, so a
prompt longer than ``max_prompt_tokens`` times that many characters is over
the token limit for sure and is refused without tokenizing. The rest runs on
one worker thread (Hugging Face's fast tokenizers release the GIL while they
encode), one prompt at a time, so the event loop keeps serving and at most one
prompt's tokenizer buffers exist at once; after a large one the free heap is
returned to the OS, since glibc keeps it otherwise.
"""

from __future__ import annotations

import asyncio
import ctypes
from concurrent.futures import ThreadPoolExecutor

from .openai_api import ApiError, CompletionRequest

# Tokenizing this many characters allocates tens of MiB (about 130 bytes per
# character here); smaller prompts leave the heap as it is.
RELEASE_HEAP_CHARS = 1 << 18

try:
    _malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc's; musl and macOS have none
except OSError:
    _malloc_trim = None


def release_free_heap() -> None:
    """Return the malloc heap's free pages to the OS, where the C library can."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def longest_token_chars(tokenizer) -> int:
    """Characters of the longest vocabulary entry (added tokens included): an
    upper bound on the characters of text one token stands for."""
    return max(map(len, tokenizer.get_vocab()))


class PromptEncoder:
    def __init__(self, tokenizer, max_prompt_tokens: int, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.vocab_size = vocab_size
        self.max_chars = max_prompt_tokens * longest_token_chars(tokenizer)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="mlxcel-tokenize")

    async def token_ids(self, request: CompletionRequest) -> list[int]:
        """The prompt's ids, checked against the limits; raises ApiError."""
        prompt = request.prompt
        if request.chat or isinstance(prompt, str):
            chars = len(prompt) if isinstance(prompt, str) else sum(len(m["role"]) + len(m["content"])
                                                                     for m in prompt)
            if chars > self.max_chars:
                raise ApiError(400, f"the prompt has {chars} characters, more than {self.max_prompt_tokens} "
                                    f"tokens (the limit) can hold", "prompt")
            return await asyncio.get_running_loop().run_in_executor(self._worker, self._encode, request, chars)
        refusal = self._refusal(prompt)
        if refusal is not None:
            raise refusal
        return prompt

    def _encode(self, request: CompletionRequest, chars: int) -> list[int]:
        """On the worker: tokenize and check; after a large prompt, return the free
        heap once a refused prompt's ids are dropped too."""
        try:
            ids = self._tokenize(request)
            refusal = self._refusal(ids)
        except ApiError as err:
            refusal = err
        if refusal is not None:
            ids = None
        if chars >= RELEASE_HEAP_CHARS:
            release_free_heap()
        if refusal is not None:
            raise refusal
        return ids

    def _tokenize(self, request: CompletionRequest) -> list[int]:
        if not request.chat:
            return list(self.tokenizer.encode(request.prompt))
        try:
            return list(self.tokenizer.apply_chat_template(request.prompt, add_generation_prompt=True))
        except Exception as err:  # the template rejects a conversation it cannot render
            raise ApiError(400, f"the chat template rejected these messages: {err}", "messages") from None

    def _refusal(self, ids: list[int]) -> ApiError | None:
        if not ids:
            return ApiError(400, "the prompt is empty", "prompt")
        if len(ids) > self.max_prompt_tokens:
            return ApiError(400, f"the prompt has {len(ids)} tokens; the limit is {self.max_prompt_tokens}",
                            "prompt")
        if any(not 0 <= t < self.vocab_size for t in ids):
            return ApiError(400, f"prompt token ids must lie in [0, {self.vocab_size})", "prompt")
        return None
