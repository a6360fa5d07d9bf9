"""The OpenAI request contract: ApiError (an error with OpenAI's body) and
CompletionRequest, which /v1/completions and /v1/chat/completions bodies are
parsed and validated into, in one place. What differs between the two routes
(the prompt's form, the shape of a choice and of its logprobs) lives here, not
in the server.

Every field a body may hold either takes effect or is refused with a 400 that
names it: the sampling fields mlx-lm's server honours (top_k, min_p, the
penalties and their context sizes, logit_bias, logprobs), vLLM's extensions
used by benchmarks (ignore_eos, return_token_ids), and OpenAI's own; what this
server cannot do (tool calls, structured output, echo, several choices) is
accepted only in its no-op form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from starlette.responses import JSONResponse

from .limits import ServerLimits
from .sequence import SamplingParams, TokenLogprob

DEFAULT_MAX_TOKENS = 256
MAX_SEED = 2**64 - 1  # mx.random.key takes an unsigned 64-bit seed
MAX_STOPS = 4
MAX_TOP_LOGPROBS = 20   # OpenAI's limit for chat, vLLM's default for both routes
# A penalised row's last tokens are sent to the device every step: a bound on that host work.
MAX_PENALTY_CONTEXT = 4096
MAX_TOP_K = 2**31 - 1

_COMMON_FIELDS = {
    "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed", "user",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
    # mlx-lm's server's
    "top_k", "min_p", "repetition_penalty", "repetition_context_size", "presence_context_size",
    "frequency_context_size",
    # vLLM's
    "ignore_eos", "return_token_ids",
}
CHAT_FIELDS = _COMMON_FIELDS | {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
                                "tool_choice", "parallel_tool_calls"}
COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "echo", "best_of", "suffix"}

TokenText = Callable[[int], str]  # a token id's text


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def number(body: dict, name: str, default, low: float, high: float, integer: bool = False):
    """body[name] checked to be a number (an integer) within [low, high]; default when absent or null."""
    value = body.get(name, default)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ApiError(400, f"'{name}' must be {'an integer' if integer else 'a number'}", name)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be between {low} and {high}, got {value}", name)
    return value


def check_model(named, model: str) -> None:
    """A request naming a model (None: it names none) must name the one served."""
    if named is not None and named != model:
        raise ApiError(404, f"model '{named}' does not exist; this server serves '{model}'", "model",
                       "not_found_error")


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be a boolean", name)
    return value


def _is_token_ids(value) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


@dataclass(frozen=True)
class CompletionRequest:
    """One completion request, every field validated. `prompt` is text or token
    ids (completions), or the {role, content} messages (chat)."""

    chat: bool
    prompt: str | list[int] | list[dict[str, str]]
    params: SamplingParams
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False  # vLLM's extension: the generated ids in each choice

    @classmethod
    def parse(cls, body: dict, *, chat: bool, model: str, limits: ServerLimits,
              vocab_size: int) -> "CompletionRequest":
        """Validate a JSON body; raises ApiError naming the first bad field."""
        known = CHAT_FIELDS if chat else COMPLETION_FIELDS
        unknown = sorted(k for k, v in body.items() if k not in known and v is not None)  # null asks for nothing
        if unknown:
            raise ApiError(400, f"'{unknown[0]}' is not a field this server supports on "
                                f"{'/v1/chat/completions' if chat else '/v1/completions'}", unknown[0])
        check_model(body.get("model"), model)
        _refuse_unsupported(body, chat)
        options = body.get("stream_options") or {}
        return cls(chat=chat, prompt=_messages(body) if chat else _prompt(body),
                   params=_sampling(body, limits, vocab_size, chat), stop=_stop_strings(body),
                   stream=_flag(body, "stream"),
                   include_usage=isinstance(options, dict) and options.get("include_usage") is True,
                   return_token_ids=_flag(body, "return_token_ids"))

    # -- the response's shape -----------------------------------------------

    @property
    def id_prefix(self) -> str:
        return "chatcmpl" if self.chat else "cmpl"

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def choice(self, text: str, reason: str | None, token_ids: list[int], logprobs: dict | None = None) -> dict:
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                   "finish_reason": reason}
                  if self.chat else {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason})
        return self._with_ids(choice, token_ids)

    def chunk_choice(self, text: str, reason: str | None, token_ids: list[int], first: bool = False,
                     logprobs: dict | None = None) -> dict:
        """A stream chunk's choice; a chat stream's first chunk names the role."""
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        choice = ({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason} if self.chat
                  else {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason})
        return choice if first else self._with_ids(choice, token_ids)

    def logprobs(self, token_ids: list[int], entries: list[TokenLogprob], token_text: TokenText,
                 offset: int = 0) -> dict | None:
        """The choice's `logprobs` for these tokens, in the route's shape (None
        unless asked for); `offset` is the completion text's length before them."""
        if self.params.logprobs is None:
            return None
        texts = [token_text(t) for t in token_ids]
        if self.chat:
            return {"content": [
                {**_chat_logprob(text, entry.logprob),
                 "top_logprobs": [_chat_logprob(token_text(t), lp) for t, lp in entry.top]}
                for text, entry in zip(texts, entries)], "refusal": None}
        offsets = []
        for text in texts:
            offsets.append(offset)
            offset += len(text)
        return {"tokens": texts, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [_by_text(e.top, token_text) for e in entries], "text_offset": offsets}

    def _with_ids(self, choice: dict, token_ids: list[int]) -> dict:
        if self.return_token_ids:
            choice["token_ids"] = token_ids
        return choice


def _by_text(top: tuple[tuple[int, float], ...], token_text: TokenText) -> dict[str, float]:
    """A completion's top tokens keyed by text; of two ids with one text, the likelier."""
    by_text: dict[str, float] = {}
    for token, logprob in top:
        by_text.setdefault(token_text(token), logprob)
    return by_text


def _chat_logprob(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def _refuse_unsupported(body: dict, chat: bool) -> None:
    """Fields accepted only in the form that asks for nothing this server lacks."""
    number(body, "n", 1, 1, 1, integer=True)  # only one choice per request
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, "'user' must be a string", "user")
    if chat:
        response_format = body.get("response_format")
        if response_format is not None and response_format != {"type": "text"}:
            raise ApiError(400, "'response_format' is not supported: this server has no structured output "
                                "(only {\"type\": \"text\"} is accepted)", "response_format")
        if body.get("tools"):
            raise ApiError(400, "'tools' is not supported: this server does not do tool calls", "tools")
        if body.get("tool_choice") not in (None, "none"):
            raise ApiError(400, "'tool_choice' is not supported: this server does not do tool calls "
                                "(only \"none\" is accepted)", "tool_choice")
        if body.get("parallel_tool_calls") not in (None, True, False):
            raise ApiError(400, "'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
        return
    if body.get("echo") not in (None, False):
        raise ApiError(400, "'echo' is not supported: the prompt is not returned", "echo")
    number(body, "best_of", 1, 1, 1, integer=True)
    if body.get("suffix") not in (None, ""):
        raise ApiError(400, "'suffix' is not supported: this server does not insert text", "suffix")


def _sampling(body: dict, limits: ServerLimits, vocab_size: int, chat: bool) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = number({"max_tokens": max_tokens}, "max_tokens",
                        min(DEFAULT_MAX_TOKENS, limits.max_completion_tokens), 1,
                        limits.max_completion_tokens, integer=True)
    min_p = float(number(body, "min_p", 0.0, 0.0, 1.0))
    if min_p == 1:
        raise ApiError(400, "'min_p' must be below 1", "min_p")

    def context(name: str) -> int:
        return number(body, name, 20, 1, MAX_PENALTY_CONTEXT, integer=True)

    def penalty(name: str, low: float, high: float) -> float | None:
        value = number(body, name, None, low, high)
        return None if value is None else float(value)

    return SamplingParams(
        max_tokens=max_tokens,
        ignore_eos=_flag(body, "ignore_eos"),  # vLLM's extension, for benchmarks
        temperature=float(number(body, "temperature", 1.0, 0.0, 2.0)),
        top_p=float(number(body, "top_p", 1.0, 0.0, 1.0)),
        top_k=number(body, "top_k", 0, 0, MAX_TOP_K, integer=True),
        min_p=min_p,
        seed=number(body, "seed", None, 0, MAX_SEED, integer=True),
        logit_bias=_logit_bias(body, vocab_size),
        repetition_penalty=penalty("repetition_penalty", 0.0, 10.0),
        repetition_context_size=context("repetition_context_size"),
        presence_penalty=penalty("presence_penalty", -2.0, 2.0),
        presence_context_size=context("presence_context_size"),
        frequency_penalty=penalty("frequency_penalty", -2.0, 2.0),
        frequency_context_size=context("frequency_context_size"),
        logprobs=_logprobs(body, chat),
    )


def _logit_bias(body: dict, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """{"token id": bias in [-100, 100]}, as OpenAI takes it."""
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    if not isinstance(bias, dict):
        raise ApiError(400, "'logit_bias' must be an object of token id -> bias", "logit_bias")
    pairs = []
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) < vocab_size):
            raise ApiError(400, f"'logit_bias' keys must be token ids in [0, {vocab_size}), got {key!r}",
                           "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise ApiError(400, f"'logit_bias' values must be numbers in [-100, 100], got {value!r}", "logit_bias")
        pairs.append((int(key), float(value)))
    return tuple(pairs)


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many likeliest tokens to report beside each sampled one (None: no logprobs).
    Chat: `logprobs` true and `top_logprobs` n; completions: `logprobs` n."""
    if not chat:
        return number(body, "logprobs", None, 0, MAX_TOP_LOGPROBS, integer=True)
    top = number(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS, integer=True)
    if not _flag(body, "logprobs"):
        if top is not None:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    return top or 0


def _stop_strings(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOPS:
        raise ApiError(400, f"'stop' must be a non-empty string or a list of up to {MAX_STOPS} of them", "stop")
    return tuple(stop)


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if not isinstance(prompt, str) and not _is_token_ids(prompt):
        raise ApiError(400, "'prompt' must be a string or a list of token ids (one prompt per request)", "prompt")
    if not prompt:
        raise ApiError(400, "the prompt is empty", "prompt")
    return prompt


def _messages(body: dict) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects", "messages")
    return [{"role": m["role"], "content": _content(m.get("content"))} for m in messages]


def _content(content) -> str:
    """A message's content: a string, or a list of text parts (joined, as mlx-lm's server does)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(400, "a message's 'content' must be a string or a list of {\"type\": \"text\", \"text\": ...} "
                        "parts (this server takes text only)", "messages")
