"""OpenAI-compatible HTTP server with Prometheus /metrics and the control API.

Starlette on uvicorn. A completion body becomes one CompletionRequest, its
prompt becomes token ids on a worker thread (PromptEncoder), and its sequence
is one _Run: engine events arrive on the engine thread and are handed to the
request's asyncio queue, and however the response ends, _Run.end lets go of
the sequence. Every request is logged once at info when its response ends
(method, route, status, tokens, latency: never a key or a prompt) and counted
in the HTTP metrics (_AccessLog).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import time
import uuid
from importlib.metadata import version

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .config import FIELDS as CASCADE_FIELDS
from .config import ConfigError
from .engine import Engine, EngineClosed
from .limits import ServerLimits
from .openai_api import ApiError, CompletionRequest, check_model, number
from .prompts import PromptEncoder
from .scheduler import RequestRejected
from .sequence import SamplingParams, Sequence
from .sessions import SessionManager, TooManySessions

log = logging.getLogger("mlxcel.server")

FAULT_RESPONSES_TIMEOUT = 2.0   # seconds a rank fault waits for the ended requests' responses to end


class OpenAIServer:
    """The app. Without an API key (and unless check_host is off) it answers only
    requests whose Host names this machine's loopback or `host`, the address it
    is bound to: a browser page of another site that points a DNS name at
    127.0.0.1 (DNS rebinding) is refused."""

    def __init__(self, engine: Engine, model_name: str, sessions: SessionManager | None = None,
                 api_key: str | None = None, limits: ServerLimits | None = None, host: str = "127.0.0.1",
                 check_host: bool = True) -> None:
        self.engine = engine
        self.model_name = model_name
        self.sessions = sessions
        self.api_key = api_key
        self.limits = limits or ServerLimits()
        self.host = host
        self.check_host = check_host
        self.prompts = PromptEncoder(engine.tokenizer, self.limits.max_prompt_tokens, engine.vocab_size)
        self.created = int(time.time())
        self.app = Starlette(routes=[
            Route("/health", self.health),
            Route("/version", self.version),
            Route("/metrics", self.metrics),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/v1/models", self.models),
            Route("/v1/models/{model_id:path}", self.model),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/cascade", self.cascade, methods=["GET", "POST"]),
            Route("/v1/sessions", self.control_sessions, methods=["GET", "POST"]),
            Route("/v1/engine", self.control_engine, methods=["GET", "POST"]),
        ], exception_handlers={ApiError: lambda request, err: err.response(), HTTPException: _http_error,
                               ClientDisconnect: _client_gone})
        self._responding: set[_Run] = set()   # runs whose response has not ended
        if engine.ranks:
            engine.ranks.on_fault.append(self._until_responses_end)
        self.app.add_middleware(_Guard, server=self)
        self.app.add_middleware(_AccessLog, metrics=engine.metrics)

    # -- plumbing -----------------------------------------------------------

    async def _json_body(self, request: Request) -> dict:
        # A JSON content type is not one a cross-site form or simple fetch may send without a preflight.
        media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            raise ApiError(415, "the body must be JSON, sent with 'Content-Type: application/json'")
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
        if b"\\ud" in raw or b"\\uD" in raw:  # only a \u escape can make a lone surrogate
            _refuse_lone_surrogates(body)
        return body

    async def _start(self, request: Request, chat: bool) -> tuple[CompletionRequest, _Run]:
        req = CompletionRequest.parse(await self._json_body(request), chat=chat, model=self.model_name,
                                      limits=self.limits, vocab_size=self.engine.vocab_size)
        ids = await self.prompts.token_ids(req)
        if len(ids) > self.engine.max_sequence_tokens:
            raise ApiError(400, f"the prompt has {len(ids)} tokens; the KV pool holds "
                                f"{self.engine.max_sequence_tokens}", "prompt")
        run = self._submit(ids, req.params)
        request.state.run = run  # for the access log: its tokens
        return req, run

    def _submit(self, ids: list[int], params: SamplingParams) -> _Run:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        with_logprobs = params.logprobs is not None

        def on_event(seq, token, reason):
            # On the engine thread, where the token's logprobs were just appended.
            entry = seq.logprobs[-1] if with_logprobs and token is not None else None
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (token, reason, entry))
            except RuntimeError:  # the request's event loop is gone; its sequence is being cancelled
                pass

        try:
            seq = self.engine.submit(ids, params, on_event, label="http")
        except RequestRejected as err:  # prompt and max_tokens together exceed the pool
            raise ApiError(400, str(err), "max_tokens") from None
        except EngineClosed as err:
            raise ApiError(503, str(err), kind="server_error") from None
        run = _Run(self.engine, seq, queue, self._responding)
        self._responding.add(run)
        return run

    def _until_responses_end(self, message: str) -> None:
        """A rank fault (on its thread): the engine has ended every request; the
        process ends once their responses did (at most FAULT_RESPONSES_TIMEOUT),
        so each client reads its error to the end of its stream."""
        deadline = time.monotonic() + FAULT_RESPONSES_TIMEOUT
        while self._responding and time.monotonic() < deadline:
            time.sleep(0.02)

    def drain(self) -> None:
        """Shutdown has begun: stop the built-in sessions, refuse new requests and
        end every in-flight one with finish reason "cancelled" at the next step."""
        if self.sessions is not None:
            self.sessions.remove(len(self.sessions.sessions))
        self.engine.close("cancelled")

    # -- OpenAI endpoints -----------------------------------------------------

    def _model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "mlxcel",
                "max_model_len": self.engine.max_sequence_tokens}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        check_model(request.path_params["model_id"], self.model_name)
        return JSONResponse(self._model_card())

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": version("mlxcel-tui")})

    async def tokenize(self, request: Request) -> Response:
        """vLLM's /tokenize: a completion's `prompt` or a chat's `messages` (the
        chat template applied) to the ids the engine would be given."""
        body = await self._json_body(request)
        chat = "messages" in body
        unknown = sorted(set(body) - ({"model", "messages"} if chat else {"model", "prompt"}))
        if unknown:
            raise ApiError(400, f"'{unknown[0]}' is not a field /tokenize supports", unknown[0])
        req = CompletionRequest.parse(body, chat=chat, model=self.model_name, limits=self.limits,
                                      vocab_size=self.engine.vocab_size)
        ids = await self.prompts.token_ids(req)
        return JSONResponse({"count": len(ids), "max_model_len": self.engine.max_sequence_tokens, "tokens": ids})

    async def detokenize(self, request: Request) -> Response:
        body = await self._json_body(request)
        unknown = sorted(set(body) - {"model", "tokens"})
        if unknown:
            raise ApiError(400, f"'{unknown[0]}' is not a field /detokenize supports", unknown[0])
        check_model(body.get("model"), self.model_name)
        tokens = body.get("tokens")
        vocab = self.engine.vocab_size
        if not isinstance(tokens, list) or len(tokens) > self.limits.max_prompt_tokens or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens):
            raise ApiError(400, f"'tokens' must be a list of up to {self.limits.max_prompt_tokens} token ids "
                                f"in [0, {vocab})", "tokens")
        return JSONResponse({"prompt": self.engine.tokenizer.decode(tokens)})

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def _complete(self, request: Request, chat: bool) -> Response:
        req, run = await self._start(request, chat)
        base = {"id": f"{req.id_prefix}-{uuid.uuid4().hex}", "object": req.object, "created": int(time.time()),
                "model": self.model_name}
        if req.stream:
            return _SequenceStream(run, self._stream(req, run, base))
        text, generated, entries = "", [], []
        try:
            async with contextlib.aclosing(run.events(req.stop)) as events:
                async for delta, _, ids, logprobs in _until_disconnect(request, events):
                    text += delta
                    generated += ids
                    entries += logprobs
        finally:
            run.end()
        logprobs = req.logprobs(generated, entries, self._token_text)
        return JSONResponse({**base, "choices": [req.choice(text, run.reason, generated, logprobs)],
                             "usage": run.usage()})

    def _token_text(self, token: int) -> str:
        return self.engine.tokenizer.decode([token])

    async def _stream(self, req: CompletionRequest, run: _Run, base: dict):
        base = {**base, "object": req.chunk_object}

        def chunk(choice: dict) -> str:
            return "data: " + json.dumps({**base, "choices": [choice]}) + "\n\n"

        if req.chat:
            yield chunk(req.chunk_choice("", None, [], first=True))
        sent = 0
        every_token = req.return_token_ids or req.params.logprobs is not None
        async for delta, reason, ids, entries in run.events(req.stop, every_token=every_token):
            if delta or reason or (every_token and ids):
                logprobs = req.logprobs(ids, entries, self._token_text, sent)
                yield chunk(req.chunk_choice(delta, reason, ids, logprobs=logprobs))
                sent += len(delta)
        if req.include_usage:
            yield "data: " + json.dumps({**base, "choices": [], "usage": run.usage()}) + "\n\n"
        yield "data: [DONE]\n\n"

    # -- metrics and control ----------------------------------------------------

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.model_name})

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def cascade(self, request: Request) -> Response:
        if request.method == "POST":
            body = await self._json_body(request)
            unknown = sorted(set(body) - set(CASCADE_FIELDS))
            if unknown:  # before any key becomes a keyword argument
                raise ApiError(400, f"unknown cascade setting(s) {', '.join(map(repr, unknown))} "
                                    f"(known: {', '.join(CASCADE_FIELDS)})")
            try:
                self.engine.cascade.update(**body)
            except ConfigError as err:
                raise ApiError(400, str(err)) from None
        # In a worker thread: the snapshot waits for the engine's state lock, held while a step is built.
        snapshot = await run_in_threadpool(lambda: self.engine.snapshot.to_dict())
        return JSONResponse({"config": self.engine.cascade.as_dict(), "snapshot": snapshot})

    async def control_sessions(self, request: Request) -> Response:
        if self.sessions is None:
            raise ApiError(404, "this server runs no built-in sessions", kind="not_found_error")
        if request.method == "POST":
            body = await self._json_body(request)
            unknown = sorted(set(body) - {"add", "remove"})
            if unknown:
                raise ApiError(400, f"unknown field(s): {', '.join(map(repr, unknown))}")
            add = number(body, "add", 0, 0, 64, integer=True)
            remove = number(body, "remove", 0, 0, 1024, integer=True)
            try:
                self.sessions.add(add)
            except TooManySessions as err:
                raise ApiError(400, str(err), "add") from None
            self.sessions.remove(remove)
        return JSONResponse({"sessions": [s.as_dict() for s in list(self.sessions.sessions)]})

    async def control_engine(self, request: Request) -> Response:
        if request.method == "POST":
            body = await self._json_body(request)
            if set(body) - {"paused"} or not isinstance(body.get("paused"), bool):
                raise ApiError(400, "the body must be {\"paused\": true|false}")
            self.engine.set_paused(body["paused"])
        return JSONResponse({"paused": self.engine.paused})


class _Run:
    """A submitted sequence and its events. end() is the one place a request lets
    go of it: a sequence still running then (the client left, a stop string
    matched, the server is shutting down) is ended with the reason its client saw."""

    def __init__(self, engine: Engine, seq: Sequence, queue: asyncio.Queue, responding: set) -> None:
        self.engine, self.seq, self.queue, self.responding = engine, seq, queue, responding
        self.reason: str | None = None  # the finish reason the client is told

    async def events(self, stop: tuple[str, ...], every_token: bool = False):
        """Yield (text delta, finish reason, new token ids, their TokenLogprobs when
        asked for); with every_token, one event per generated token even while the
        detokenizer holds its text back."""
        detok = self.engine.tokenizer.detokenizer
        eos = self.engine.tokenizer.eos_token_ids
        text, sent, ids, entries = "", 0, [], []
        holdback = max((len(s) - 1 for s in stop), default=0)  # a tail that could still grow into a stop string
        while self.reason is None:
            token, reason, entry = await self.queue.get()
            if token is not None:
                ids.append(token)
            if entry is not None:
                entries.append(entry)
            if token is not None and token not in eos:
                detok.add_token(token)
            if reason is not None:
                detok.finalize()
            text += detok.last_segment
            hit = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
            if hit >= 0:
                text, reason = text[:hit], "stop"
            safe = len(text) if reason else max(sent, len(text) - holdback)
            self.reason = reason
            if safe > sent or reason or (every_token and ids):
                yield text[sent:safe], reason, ids, entries
                sent, ids, entries = safe, [], []

    def end(self) -> None:
        self.responding.discard(self)
        if not self.seq.is_finished:
            self.engine.cancel(self.seq, "stop" if self.reason == "stop" else "cancelled")

    def usage(self) -> dict:
        seq = self.seq
        return {"prompt_tokens": seq.num_prompt_tokens, "completion_tokens": seq.num_completion_tokens,
                "total_tokens": len(seq), "prompt_tokens_details": {"cached_tokens": seq.num_reused_tokens}}


class _SequenceStream(StreamingResponse):
    """An SSE response that ends its run however it ends. A client gone before
    the body is first iterated (the write of the headers fails, say) never
    starts the generator, so no finally inside it would run."""

    def __init__(self, run: _Run, content) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.run = run

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.run.end()


async def _until_disconnect(request: Request, events):
    """Iterate events, abandoning them if the client leaves."""
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


def _refuse_lone_surrogates(body: dict) -> None:
    """json.loads turns a lone \\ud800 escape into a str that cannot be encoded
    as UTF-8: it would fail the tokenizer, or an error reply that echoes it."""
    try:
        json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise ApiError(400, "the JSON body holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape "
                            "that is not half of a pair)") from None


def _http_error(request: Request, err: HTTPException) -> Response:
    """Starlette's own refusals (no such route, wrong method) as OpenAI-style bodies."""
    kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
    return ApiError(err.status_code, err.detail, kind=kind, headers=err.headers).response()


def _client_gone(request: Request, err: ClientDisconnect) -> Response:
    """The client left while sending its body: nothing is left to answer, and
    nothing to log (uvicorn drops a reply to a closed connection)."""
    return ApiError(400, "the client disconnected before its body arrived").response()


def _hostname(host: str) -> str:
    """The name in a Host header, without its port or an IPv6 address's brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_local_host(host: str, bound: str) -> bool:
    """A Host header that names this machine's loopback (localhost, a name under
    .localhost, a loopback address) or the address bound."""
    name = _hostname(host)
    if name in ("localhost", _hostname(bound)) or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


UNAUTHENTICATED = ("/metrics", "/health")


class _Guard:
    """Every request, before routing: the Host check (see OpenAIServer), no
    Origin but the server's own (there is no CORS: a browser page of another
    site gets nothing), and with a key, the bearer token on every endpoint but
    /metrics and /health (as vLLM's: probes and scrapers carry no key)."""

    def __init__(self, app, server: OpenAIServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            error = self._refusal(scope)
            if error is not None:
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope) -> ApiError | None:
        server = self.server
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        if server.check_host and not server.api_key and host and not is_local_host(host, server.host):
            return ApiError(403, f"Host '{host}' is not this server's address (a DNS name pointed at it?); "
                                 "serve with an API key or --no-host-check to accept it", kind="permission_error")
        origin = headers.get(b"origin")
        if origin is not None and origin.decode("latin-1").lower() != f"{scope['scheme']}://{host}".lower():
            return ApiError(403, "cross-origin requests are refused (this server sends no CORS headers)",
                            kind="permission_error")
        key = server.api_key
        if key and scope["path"] not in UNAUTHENTICATED:
            if not hmac.compare_digest(headers.get(b"authorization", b""), f"Bearer {key}".encode()):
                return ApiError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                                kind="authentication_error", headers={"WWW-Authenticate": "Bearer"})
        return None


class _AccessLog:
    """Outermost: every HTTP request, refused or routed, logged once at info
    when its response ends and counted in the HTTP metrics by route (the
    route's template, so a client cannot mint label values) and status."""

    def __init__(self, app, metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # unless a response starts

        async def sending(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self._done(scope, status, time.perf_counter() - start)

    def _done(self, scope, status: int, seconds: float) -> None:
        route = scope.get("route")
        name = route.path if route is not None else "unmatched"
        method = scope["method"] if scope["method"] in ("GET", "POST", "HEAD", "OPTIONS") else "other"
        self.metrics.http_request(method, name, status, seconds)
        run = scope.get("state", {}).get("run")
        tokens = (f" prompt_tokens={run.seq.num_prompt_tokens} completion_tokens={run.seq.num_completion_tokens}"
                  f" finish={run.reason or run.seq.finish_reason}" if run is not None else "")
        log.info("%s %s %d%s %.1f ms", method, name, status, tokens, seconds * 1e3)
