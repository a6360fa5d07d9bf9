"""OpenAI-compatible HTTP server with Prometheus /metrics and the control API.

Starlette on uvicorn. Engine events arrive on the engine thread and are handed
to each request's asyncio queue; a client that goes away cancels its sequence.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .config import ConfigError
from .engine import Engine, EngineClosed
from .limits import ServerLimits
from .scheduler import RequestRejected
from .sequence import SamplingParams, Sequence
from .sessions import SessionManager, TooManySessions

log = logging.getLogger("mlxcel.server")

DEFAULT_MAX_TOKENS = 256
MAX_SEED = 2**64 - 1  # mx.random.key takes an unsigned 64-bit seed


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}
        return JSONResponse(body, status_code=self.status)


# -- request validation ----------------------------------------------------

def _number(body: dict, name: str, default, low: float, high: float, integer: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ApiError(400, f"'{name}' must be {'an integer' if integer else 'a number'}", name)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be between {low} and {high}, got {value}", name)
    return value


def _stop_strings(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise ApiError(400, "'stop' must be a non-empty string or a list of up to 4 of them", "stop")
    return stop


def sampling_from_body(body: dict, limits: ServerLimits) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _number({"max_tokens": max_tokens}, "max_tokens",
                         min(DEFAULT_MAX_TOKENS, limits.max_completion_tokens), 1,
                         limits.max_completion_tokens, integer=True)
    n = _number(body, "n", 1, 1, 1, integer=True)
    del n  # only one choice per request
    seed = _number(body, "seed", None, 0, MAX_SEED, integer=True)
    ignore_eos = body.get("ignore_eos", False)  # vLLM's extension, for benchmarks
    if not isinstance(ignore_eos, bool):
        raise ApiError(400, "'ignore_eos' must be a boolean", "ignore_eos")
    return SamplingParams(
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        temperature=float(_number(body, "temperature", 1.0, 0.0, 2.0)),
        top_p=float(_number(body, "top_p", 1.0, 0.0, 1.0)),
        seed=seed,
    )


class OpenAIServer:
    def __init__(self, engine: Engine, model_name: str, sessions: SessionManager | None = None,
                 api_key: str | None = None, limits: ServerLimits | None = None) -> None:
        self.engine = engine
        self.model_name = model_name
        self.sessions = sessions
        self.api_key = api_key
        self.limits = limits or ServerLimits()
        self.created = int(time.time())
        self.app = Starlette(routes=[
            Route("/health", self.health),
            Route("/metrics", self.metrics),
            Route("/v1/models", self.models),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/cascade", self.cascade, methods=["GET", "POST"]),
            Route("/v1/sessions", self.control_sessions, methods=["GET", "POST"]),
            Route("/v1/engine", self.control_engine, methods=["GET", "POST"]),
        ], exception_handlers={ApiError: lambda request, err: err.response(), HTTPException: _http_error})
        self.app.add_middleware(_Guard, server=self)

    # -- plumbing -----------------------------------------------------------

    async def _json_body(self, request: Request) -> dict:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limits.max_body_bytes:
            raise ApiError(413, f"request body over {self.limits.max_body_bytes} bytes")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > self.limits.max_body_bytes:
                raise ApiError(413, f"request body over {self.limits.max_body_bytes} bytes")
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as err:  # syntax, encoding, an over-long integer, deep nesting
            raise ApiError(400, f"malformed JSON body: {err}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the JSON body must be an object")
        return body

    def _check_model(self, body: dict) -> None:
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise ApiError(404, f"model '{model}' does not exist; this server serves '{self.model_name}'",
                           "model", "not_found_error")

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ApiError(400, "the prompt is empty", "prompt")
        if len(ids) > self.limits.max_prompt_tokens:
            raise ApiError(400, f"the prompt has {len(ids)} tokens; the limit is "
                                f"{self.limits.max_prompt_tokens}", "prompt")
        vocab = self.engine.loaded.model.args.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise ApiError(400, f"prompt token ids must lie in [0, {vocab})", "prompt")

    def _start(self, ids: list[int], params: SamplingParams) -> tuple[Sequence, asyncio.Queue]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_event(seq, token, reason):
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (token, reason))
            except RuntimeError:  # the request's event loop is gone; its sequence is being cancelled
                pass

        try:
            seq = self.engine.submit(ids, params, on_event, label="http")
        except RequestRejected as err:
            raise ApiError(400, str(err), "max_tokens") from None
        except EngineClosed as err:
            raise ApiError(503, str(err), kind="server_error") from None
        return seq, queue

    def drain(self) -> None:
        """Shutdown has begun: stop the built-in sessions, refuse new requests and
        end every in-flight one with finish reason "cancelled" at the next step."""
        if self.sessions is not None:
            self.sessions.remove(len(self.sessions.sessions))
        self.engine.close("cancelled")

    async def _events(self, seq: Sequence, queue: asyncio.Queue, stop: list[str], every_token: bool = False):
        """Yield (text delta, finish reason, new token ids); with every_token, one
        event per generated token even while the detokenizer holds its text back.
        Cancels the sequence if abandoned."""
        detok = self.engine.tokenizer.detokenizer
        eos = self.engine.tokenizer.eos_token_ids
        text, sent, reason, ids = "", 0, None, []
        try:
            while reason is None:
                token, reason = await queue.get()
                if token is not None:
                    ids.append(token)
                if token is not None and token not in eos:
                    detok.add_token(token)
                if reason is not None:
                    detok.finalize()
                text += detok.last_segment
                hit = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
                if hit >= 0:
                    text, reason = text[:hit], "stop"
                    self.engine.cancel(seq, "stop")
                # Hold back a tail that could still grow into a stop string.
                safe = len(text) if reason else max(sent, len(text) - max((len(s) - 1 for s in stop), default=0))
                if safe > sent or reason or (every_token and ids):
                    yield text[sent:safe], reason, ids
                    sent, ids = safe, []
        finally:
            if reason is None:
                self.engine.cancel(seq)

    def _usage(self, seq: Sequence) -> dict:
        return {"prompt_tokens": seq.num_prompt_tokens, "completion_tokens": seq.num_completion_tokens,
                "total_tokens": len(seq), "prompt_tokens_details": {"cached_tokens": seq.num_reused_tokens}}

    # -- OpenAI endpoints -----------------------------------------------------

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "mlxcel"}]})

    async def completions(self, request: Request) -> Response:
        body = await self._json_body(request)
        self._check_model(body)
        params = sampling_from_body(body, self.limits)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = list(self.engine.tokenizer.encode(prompt))
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = prompt
        else:
            raise ApiError(400, "'prompt' must be a string or a list of token ids (one prompt per request)",
                           "prompt")
        self._check_prompt(ids)
        return await self._respond(request, body, ids, params, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        body = await self._json_body(request)
        self._check_model(body)
        params = sampling_from_body(body, self.limits)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects "
                                "with string content", "messages")
        try:
            ids = list(self.engine.tokenizer.apply_chat_template(
                [{"role": m["role"], "content": m["content"]} for m in messages], add_generation_prompt=True))
        except Exception as err:  # the template rejects a conversation it cannot render
            raise ApiError(400, f"the chat template rejected these messages: {err}", "messages") from None
        self._check_prompt(ids)
        return await self._respond(request, body, ids, params, chat=True)

    async def _respond(self, request: Request, body: dict, ids: list[int], params: SamplingParams,
                       chat: bool) -> Response:
        stop = _stop_strings(body)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, "'stream' must be a boolean", "stream")
        options = body.get("stream_options") or {}
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        token_ids = body.get("return_token_ids", False)  # vLLM's extension: generated ids per choice
        if not isinstance(token_ids, bool):
            raise ApiError(400, "'return_token_ids' must be a boolean", "return_token_ids")
        seq, queue = self._start(ids, params)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        base = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_name}
        if stream:
            return _SequenceStream(self.engine, seq, self._stream(seq, queue, stop, base, chat, include_usage,
                                                                  token_ids))
        text, reason, generated = "", None, []
        events = self._events(seq, queue, stop)
        try:
            async for delta, reason, new_ids in _until_disconnect(request, events):
                text += delta
                generated += new_ids
        finally:
            await events.aclose()
            if reason is None:  # the client left, perhaps before the events were first awaited
                self.engine.cancel(seq)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
                  if chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
        if token_ids:
            choice["token_ids"] = generated
        return JSONResponse({**base, "choices": [choice], "usage": self._usage(seq)})

    async def _stream(self, seq, queue, stop, base, chat, include_usage, token_ids=False):
        base = {**base, "object": "chat.completion.chunk" if chat else "text_completion"}

        def chunk(delta: dict | str, reason, ids=None):
            choice = ({"index": 0, "delta": delta, "finish_reason": reason} if chat
                      else {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason})
            if ids is not None:
                choice["token_ids"] = ids
            return "data: " + json.dumps({**base, "choices": [choice]}) + "\n\n"

        if chat:
            yield chunk({"role": "assistant", "content": ""}, None)
        async for delta, reason, ids in self._events(seq, queue, stop, every_token=token_ids):
            if delta or reason or (token_ids and ids):
                yield chunk({"content": delta} if chat else delta, reason, ids if token_ids else None)
        if include_usage:
            yield "data: " + json.dumps({**base, "choices": [], "usage": self._usage(seq)}) + "\n\n"
        yield "data: [DONE]\n\n"

    # -- metrics and control ----------------------------------------------------

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.model_name})

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def cascade(self, request: Request) -> Response:
        if request.method == "POST":
            body = await self._json_body(request)
            try:
                self.engine.cascade.update(**body)
            except ConfigError as err:
                raise ApiError(400, str(err)) from None
        return JSONResponse({"config": self.engine.cascade.as_dict(),
                             "snapshot": self.engine.snapshot.to_dict()})

    async def control_sessions(self, request: Request) -> Response:
        if self.sessions is None:
            raise ApiError(404, "this server runs no built-in sessions", kind="not_found_error")
        if request.method == "POST":
            body = await self._json_body(request)
            unknown = set(body) - {"add", "remove"}
            if unknown:
                raise ApiError(400, f"unknown field(s): {', '.join(sorted(unknown))}")
            add = _number(body, "add", 0, 0, 64, integer=True)
            remove = _number(body, "remove", 0, 0, 1024, integer=True)
            try:
                self.sessions.add(add)
            except TooManySessions as err:
                raise ApiError(400, str(err), "add") from None
            self.sessions.remove(remove)
        return JSONResponse({"sessions": [{"id": s.id, "label": s.label, "turns": s.turns}
                                          for s in self.sessions.sessions]})

    async def control_engine(self, request: Request) -> Response:
        if request.method == "POST":
            body = await self._json_body(request)
            if set(body) - {"paused"} or not isinstance(body.get("paused"), bool):
                raise ApiError(400, "the body must be {\"paused\": true|false}")
            self.engine.set_paused(body["paused"])
        return JSONResponse({"paused": self.engine.paused})


def _http_error(request: Request, err: HTTPException) -> Response:
    """Starlette's own refusals (no such route, wrong method) as OpenAI-style bodies."""
    kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
    response = ApiError(err.status_code, err.detail, kind=kind).response()
    response.headers.update(err.headers or {})
    return response


class _SequenceStream(StreamingResponse):
    """An SSE response that cancels its sequence however it ends. A client gone
    before the body is first iterated (the write of the headers fails, say)
    never starts the generator, so no finally inside it would run."""

    def __init__(self, engine: Engine, seq: Sequence, content) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.engine, self.seq = engine, seq

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.seq.is_finished:
                self.engine.cancel(self.seq)


async def _until_disconnect(request: Request, events):
    """Iterate events, abandoning them (and so cancelling the sequence) if the client leaves."""
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        while True:
            step = asyncio.ensure_future(events.__anext__())
            done, _ = await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if step not in done:
                step.cancel()
                await asyncio.wait({step})  # let the generator unwind before anyone closes it
                return
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        watcher.cancel()


async def _wait_disconnect(request: Request) -> None:
    """Return when the client goes away (the body is read, so nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Guard:
    """Bearer-token check on every endpoint but /metrics, when a key is set."""

    def __init__(self, app, server: OpenAIServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope, receive, send):
        key = self.server.api_key
        if scope["type"] == "http" and key and scope["path"] != "/metrics":
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                await ApiError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                               kind="authentication_error").response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
