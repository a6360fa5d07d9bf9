"""The OpenAI request contract: ApiError (an error with OpenAI's body) and
CompletionRequest, which /v1/completions and /v1/chat/completions bodies are
parsed and validated into, in one place. What differs between the two routes
(the prompt's form, the shape of a choice) lives here, not in the server."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.responses import JSONResponse

from .limits import ServerLimits
from .sequence import SamplingParams

DEFAULT_MAX_TOKENS = 256
MAX_SEED = 2**64 - 1  # mx.random.key takes an unsigned 64-bit seed
MAX_STOPS = 4


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
    def parse(cls, body: dict, *, chat: bool, model: str, limits: ServerLimits) -> "CompletionRequest":
        """Validate a JSON body; raises ApiError naming the first bad field."""
        named = body.get("model")
        if named is not None and named != model:
            raise ApiError(404, f"model '{named}' does not exist; this server serves '{model}'",
                           "model", "not_found_error")
        options = body.get("stream_options") or {}
        return cls(chat=chat, prompt=_messages(body) if chat else _prompt(body),
                   params=_sampling(body, limits), stop=_stop_strings(body), stream=_flag(body, "stream"),
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

    def choice(self, text: str, reason: str | None, token_ids: list[int]) -> dict:
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
                  if self.chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
        return self._with_ids(choice, token_ids)

    def chunk_choice(self, text: str, reason: str | None, token_ids: list[int], first: bool = False) -> dict:
        """A stream chunk's choice; a chat stream's first chunk names the role."""
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        choice = ({"index": 0, "delta": delta, "finish_reason": reason} if self.chat
                  else {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
        return choice if first else self._with_ids(choice, token_ids)

    def _with_ids(self, choice: dict, token_ids: list[int]) -> dict:
        if self.return_token_ids:
            choice["token_ids"] = token_ids
        return choice


def _sampling(body: dict, limits: ServerLimits) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = number({"max_tokens": max_tokens}, "max_tokens",
                        min(DEFAULT_MAX_TOKENS, limits.max_completion_tokens), 1,
                        limits.max_completion_tokens, integer=True)
    number(body, "n", 1, 1, 1, integer=True)  # only one choice per request
    return SamplingParams(
        max_tokens=max_tokens,
        ignore_eos=_flag(body, "ignore_eos"),  # vLLM's extension, for benchmarks
        temperature=float(number(body, "temperature", 1.0, 0.0, 2.0)),
        top_p=float(number(body, "top_p", 1.0, 0.0, 1.0)),
        seed=number(body, "seed", None, 0, MAX_SEED, integer=True),
    )


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
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects with string content",
                       "messages")
    return [{"role": m["role"], "content": m["content"]} for m in messages]
