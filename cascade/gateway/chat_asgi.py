"""POST /v1/chat/completions as a plain ASGI handler in front of the Litestar app.

Why not a Litestar route: a streamed completion is one ASGI `send` per upstream read, tens of
thousands per second at 200 streams, and on that path Litestar's streaming response (a task group
per response, a middleware wrapper around every `send`) cost about a fifth of the gateway's CPU
(py-spy, benchmarks/gateway_overhead.py). Everything else (/v1/route, /v1/models, /health, /ready,
/metrics, 404/405 for unknown routes) stays in Litestar; both share ChatService, the body reader's
limits and the OpenAI error objects, and the same tests run against both.

Disconnects: after the body is read, a watcher awaits `http.disconnect` and cancels the work, which
closes the upstream streams (the engine stops; SGLang also gets `/abort_request`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import msgspec

from cascade.errors import CascadeError, PayloadTooLarge, Unauthorized
from cascade.gateway.errors import error_response, openai_error, retry_after, status_for
from cascade.gateway.service import ChatService, Decision
from cascade.schemas import ChatCompletionRequest

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]  # Litestar's own ASGI types are narrower than these

log = logging.getLogger("cascade.gateway")
_encode = msgspec.json.Encoder().encode
PATH = "/v1/chat/completions"


class ClientGone(Exception):
    """The client disconnected before the response was complete."""


class ChatCompletionsASGI:
    def __init__(self, app: ASGIApp, service: ChatService, api_keys: tuple[str, ...],
                 decode: Callable[[bytes], ChatCompletionRequest]) -> None:
        self.app = app
        self.service = service
        self.keys = frozenset(api_keys)
        self.decode = decode

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            message = f"method {scope['method']} is not allowed on {PATH}"
            await _respond(send, 405, error_response(message, "invalid_request_error"), [(b"allow", b"POST")])
            return
        started = False

        async def tracked_send(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            started = True
            try:
                await send(message)
            except OSError as exc:  # uvicorn: the client closed the connection
                raise ClientGone() from exc

        try:
            await self._handle(scope, receive, tracked_send)
        except ClientGone:
            return
        except CascadeError as exc:
            if started:
                raise
            status = status_for(exc)
            if status < 500:
                self.service.metrics.client_errors.labels(str(status)).inc()
            else:
                log.warning("POST %s -> %d: %s", PATH, status, exc.message)
            await _respond(send, status, openai_error(exc, status), retry_after(exc))
        except Exception:
            log.exception("unhandled error on POST %s", PATH)
            if not started:  # never a traceback to the client; the log has it
                await _respond(send, 500, error_response("internal error in the gateway", "server_error"))

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self._check_auth(headers)
        raw = await self._read_body(headers, receive)
        service = self.service
        req = self.decode(raw)
        max_tokens = service.validate(req)
        decision = service.decide(req, headers.get("x-cascade-quality"))
        service.preflight(req, decision)
        service.admit()
        guard = _DisconnectGuard(receive)
        try:
            if req.stream:
                await guard.run(_stream(service, req, decision, max_tokens, send))
            else:
                completion = await guard.run(service.complete(req, decision, max_tokens))
                await _respond(send, 200, _encode(completion), [(b"x-cascade-tier", completion.model.encode())])
        finally:
            guard.close()
            service.release()

    def _check_auth(self, headers: dict[str, str]) -> None:
        if not self.keys:
            return
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or token not in self.keys:
            raise Unauthorized("missing or invalid API key: send `Authorization: Bearer <key>`")

    async def _read_body(self, headers: dict[str, str], receive: Receive) -> bytes:
        limit = self.service.limits.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit}", None, "request_too_large")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes", None, "request_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _stream(service: ChatService, req: ChatCompletionRequest, decision: Decision, max_tokens: int,
                  send: Send) -> None:
    decision, frames = await service.open_stream(req, decision, max_tokens)
    try:
        # Started before anything else can fail: closing a started generator is what closes the upstreams.
        first = await anext(frames)
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                   (b"x-accel-buffering", b"no"), (b"x-cascade-tier", decision.tier.name.encode())]
        if decision.accept is not None:
            # The answering tier is known only at the end: the chunks' `model` and `cascade` name it.
            headers.append((b"x-cascade-mode", b"cascade"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": first, "more_body": True})
        async for frame in frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await frames.aclose()


class _DisconnectGuard:
    """Cancels the request's own task when the client disconnects, and so the upstream generation.

    One watcher task per request, and the work runs in the request's task: wrapping each phase in
    its own task (plus a watcher each) cost measurable CPU per stream at hundreds of streams."""

    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
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
            # Our own cancel (the client left) becomes ClientGone; the server's cancel propagates.
            if self.gone and self._task.uncancel() == 0:
                raise ClientGone() from None
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
