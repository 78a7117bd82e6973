"""POST /v1/chat/completions and POST /v1/responses as plain ASGI handlers in front of the Litestar app.

Why not a Litestar route: a streamed completion is one ASGI `send` per upstream read, tens of
thousands per second at 200 streams, and on that path Litestar's streaming response (a task group
per response, a middleware wrapper around every `send`) cost about a fifth of the gateway's CPU
(py-spy, benchmarks/frontdoor/gateway_overhead.py). Everything else (/v1/route, /v1/models, /health, /ready,
/metrics, 404/405 for unknown routes) stays in Litestar; both share ChatService, the body reader's
limits and the OpenAI error objects, and the same tests run against both.

POST /v1/responses (OpenAI's Responses API, cascade/service/responses_api/) shares this adapter rather than being a
Litestar route: its stream is the chat stream translated event by event, and it needs what this adapter gives the
chat stream (the disconnect watcher that stops the engines, the drain's ending, one `send` per frame). Its stored
responses' GET and DELETE are plain Litestar routes (cascade/gateway/app.py).

Each route is an adapter: read the caller and its request (`ChatService.intake` / `ResponsesService.intake`: the API
key, the body under its size limit, decoded), make one call (`ChatService.chat`, which validates, checks the key's
permits, routes, admits, serves and bills; `ResponsesService.create` over it), write its reply: a whole response, or
a started stream relayed frame by frame and then closed (which gives the request's lease back and bills its key).

Paths: every request's path is put in normal form first (cascade/service/paths.py: `/v1/chat/%63ompletions` is the
chat path, an encoded slash is a 400), for every route, the same form the Envoy model picker decides on.

Disconnects: after the body is read, a watcher awaits `http.disconnect` and cancels the work, which
closes the upstream streams (the engine stops; SGLang also gets `/abort_request`).

Shutdown (cascade/gateway/drain.py): while draining, new requests get 503; a request the drain cancels
when its grace runs out ends with a 503 error object or, once its stream has started, an error event (a Responses
stream: `error` and `response.failed`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any

import msgspec

from cascade import tracing
from cascade.errors import CascadeError
from cascade.gateway.drain import (
    DRAIN_KEY,
    DRAINING_HEADERS,
    LIMITS_KEY,
    MESSAGE,
    SERVED_WHILE_DRAINING,
    Drain,
    ShuttingDown,
    shutdown_error,
    shutdown_stream_end,
)
from cascade.schemas import ChatCompletion, ChatCompletionRequest
from cascade.service.chat import ChatService, StreamReply, WholeReply
from cascade.service.errors import error_reply, error_response, internal_error
from cascade.service.keys.costs import cost_header
from cascade.service.keys.tenant import Tenant
from cascade.service.paths import normalize_path
from cascade.service.responses_api.service import ResponsesService, ResponseStream, WholeResponse
from cascade.service.responses_api.wire import ResponsesRequest

# A conversation's key for a tier's replica choice by prefix ([tiers.replicas] choice = "prefix"), as SGLang model
# gateway's routing-key header; the body's `prompt_cache_key` wins over it.
SESSION_HEADER = "x-session-id"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]  # Litestar's own ASGI types are narrower than these

_encode = msgspec.json.Encoder().encode
PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"
SERVED_HERE = frozenset({PATH, RESPONSES_PATH})
TRACED_PATHS = frozenset({PATH, RESPONSES_PATH, "/v1/route"})
YIELD_EVERY = 256  # frames sent between explicit yields to the event loop (see _stream)


class ClientGone(Exception):
    """The client disconnected before the response was complete."""


class ChatCompletionsASGI:
    def __init__(self, app: ASGIApp, service: ChatService, responses: ResponsesService) -> None:
        """`responses`: the Responses API over `service`."""
        self.app = app
        self.service = service
        self.responses = responses
        self.drain = Drain()  # `cascade serve` sets its grace

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":  # every route sees the path in normal form, as the Envoy picker does
            raw = scope.get("raw_path")
            path = normalize_path(scope["path"] if raw is None else raw.decode("latin-1"))
            if path is None:
                message = "the path has an encoded slash or backslash (%2F, %5C), which no route has"
                await _respond(send, 400, error_response(message, "invalid_request_error", None, "invalid_path"))
                return
            scope["path"] = path
        # Tracing (cascade/tracing/): a SERVER span around the routes that route or serve, when it is on.
        if (tracer := tracing.active) is not None and scope["type"] == "http" and scope["path"] in TRACED_PATHS:
            await tracer.serve(self._dispatch, scope, receive, send)
        else:
            await self._dispatch(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in SERVED_HERE:
            if scope["type"] == "lifespan" and (state := scope.get("state")) is not None:
                # For the server's connections (cascade/gateway/connections.py).
                state[LIMITS_KEY], state[DRAIN_KEY] = self.service.limits, self.drain
            elif self.drain.draining and scope["type"] == "http" and scope["path"] not in SERVED_WHILE_DRAINING:
                body = b'{"status":"draining"}' if scope["path"] == "/ready" else shutdown_error()
                await _respond(send, 503, body, DRAINING_HEADERS)
                return
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            await _respond(send, 503, shutdown_error(), DRAINING_HEADERS)
            return
        path = scope["path"]
        if scope["method"] != "POST":
            message = f"method {scope['method']} is not allowed on {path}"
            await _respond(send, 405, error_response(message, "invalid_request_error"), [(b"allow", b"POST")])
            return
        started = False
        ending = [shutdown_stream_end]  # a started stream's last bytes if the drain ends it

        async def tracked_send(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            started = True
            try:
                await send(message)
            except OSError as exc:  # uvicorn: the client closed the connection
                raise ClientGone() from exc

        try:
            await self._handle(scope, receive, tracked_send, ending)
        except ClientGone:
            return
        except ShuttingDown:  # raised only around the work: once started, the response is a stream
            with contextlib.suppress(OSError):
                if started:
                    await send({"type": "http.response.body", "body": ending[0](), "more_body": False})
                else:
                    await _respond(send, 503, shutdown_error(), DRAINING_HEADERS)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not (self.drain.expired and task is not None and task.uncancel() == 0):
                raise
            if not started:  # cancelled before the work (reading the body); after it, nothing to mend
                with contextlib.suppress(OSError):
                    await _respond(send, 503, shutdown_error(), DRAINING_HEADERS)
        except CascadeError as exc:
            if started:
                raise
            await _respond(send, *error_reply(exc, self.service.metrics, "POST", path))
        except Exception:
            body = internal_error("POST", path)
            if not started:
                await _respond(send, 500, body)

    async def _handle(self, scope: Scope, receive: Receive, send: Send, ending: list[Callable[[], bytes]]) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        authorization, declared = headers.get("authorization", ""), headers.get("content-length")
        hint, session = headers.get("x-cascade-quality"), headers.get(SESSION_HEADER)
        work: Callable[[_DisconnectGuard], Awaitable[None]]
        if scope["path"] == RESPONSES_PATH:
            caller, request = await self.responses.intake(authorization, _body_chunks(receive), declared)
            work = partial(self._respond_to, request, caller, hint, session, send, ending)
        else:
            caller, req = await self.service.intake(authorization, _body_chunks(receive), declared)
            if req.prompt_cache_key is None and session:
                req.prompt_cache_key = session  # the key by header, for clients and proxies that cannot add a field
            work = partial(self._reply, req, caller, hint, send)
        guard = _DisconnectGuard(receive, self.drain)
        try:
            await guard.run(work(guard))
        finally:
            guard.close()

    async def _reply(self, req: ChatCompletionRequest, caller: Tenant | None, hint: str | None, send: Send,
                     guard: _DisconnectGuard) -> None:
        reply = await self.service.chat(req, caller=caller, hint_header=hint, client=guard)
        if isinstance(reply, WholeReply):
            completion = reply.completion
            await _respond(send, 200, _encode(completion), _answered(completion, reply.headers))
            return
        await _send_stream(reply, guard, send)

    async def _respond_to(self, req: ResponsesRequest, caller: Tenant | None, hint: str | None, session: str | None,
                          send: Send, ending: list[Callable[[], bytes]], guard: _DisconnectGuard) -> None:
        reply = await self.responses.create(req, caller=caller, hint_header=hint, session=session, client=guard)
        if isinstance(reply, WholeResponse):
            await _respond(send, 200, reply.body, _answered(reply.completion, reply.headers))
            return
        if isinstance(reply, ResponseStream) and (end := reply.shutdown_end) is not None:
            ending[0] = lambda: end(MESSAGE)
        await _send_stream(reply, guard, send)


def _answered(completion: ChatCompletion, limits: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A whole answer's headers: the tier that served it, its bill and cost, the key's rate-limit headers."""
    extra = [(b"x-cascade-tier", completion.model.encode()), *limits]
    if completion.cascade is not None and completion.cascade.billed is not None:
        extra.append((b"x-cascade-billed-tokens", b"%d" % completion.cascade.billed.total_tokens))
    if completion.cascade is not None and completion.cascade.cost is not None:
        extra.append((b"x-cascade-cost", cost_header(completion.cascade.cost)))
    return extra


async def _send_stream(reply: StreamReply, guard: _DisconnectGuard, send: Send) -> None:
    """`reply` relayed frame by frame, then closed, however it ends (which gives the request's lease back)."""
    try:
        await _stream(reply, send, reply.headers)
    except ClientGone:
        guard.gone = True  # the service counts the disconnect when the stream closes, below
        raise
    finally:
        await reply.frames.aclose()


async def _body_chunks(receive: Receive) -> AsyncIterator[bytes]:
    """The request body's chunks as the server receives them; a disconnect before its end is ClientGone."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def _stream(reply: StreamReply, send: Send, limits: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no"), (b"x-cascade-tier", reply.tier.encode()), *limits]
    if reply.judged:
        # The answering tier is known only at the end: the chunks' `model` and `cascade` name it.
        headers.append((b"x-cascade-mode", b"cascade"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": reply.first, "more_body": True})
    sent = 0
    async for frame in reply.frames:
        await send({"type": "http.response.body", "body": frame, "more_body": True})
        sent += 1
        if not sent % YIELD_EVERY:
            # After a disconnect uvicorn's send returns at once, and an upstream that always has data
            # buffered never suspends this loop: yield now and then so the disconnect watcher can stop it.
            await asyncio.sleep(0)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class _DisconnectGuard:
    """Cancels the request's own task when the client disconnects, and so the upstream generation.

    One watcher task per request, and the work runs in the request's task: wrapping each phase in
    its own task (plus a watcher each) cost measurable CPU per stream at hundreds of streams."""

    def __init__(self, receive: Receive, drain: Drain) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._drain = drain
        self.gone = False
        self._watcher = asyncio.ensure_future(_disconnected(receive))
        self._watcher.add_done_callback(self._on_disconnect)

    def _on_disconnect(self, watcher: asyncio.Future[None]) -> None:
        if not watcher.cancelled() and watcher.exception() is None:
            self.gone = True
            self._task.cancel()

    async def run(self, work: Awaitable[Any]) -> Any:
        try:
            return await work
        except asyncio.CancelledError:
            # Our own cancel (the client left) becomes ClientGone, the drain's (its grace ran out)
            # ShuttingDown; any other cancel propagates.
            if (self.gone or self._drain.expired) and self._task.uncancel() == 0:
                raise (ClientGone() if self.gone else ShuttingDown()) from None
            raise

    def close(self) -> None:
        self._watcher.remove_done_callback(self._on_disconnect)
        self._watcher.cancel()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _respond(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
