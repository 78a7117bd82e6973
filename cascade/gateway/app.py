"""The Litestar app: thin routes over ChatService, OpenAI error objects for every failure."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.exceptions import HTTPException
from litestar.response import Stream

from cascade.errors import CascadeError, InvalidRequest, PayloadTooLarge, Unauthorized
from cascade.gateway.errors import error_response, status_for
from cascade.gateway.service import ChatService, Decision
from cascade.schemas import ChatCompletionRequest

log = logging.getLogger("cascade.gateway")
_decode_request = msgspec.json.Decoder(ChatCompletionRequest).decode
_encode = msgspec.json.Encoder().encode
_JSON = "application/json"


def create_app(
    service: ChatService,
    api_keys: tuple[str, ...] = (),
    ready_check: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    on_startup: list[Callable[[], Awaitable[None]]] | None = None,
    on_shutdown: list[Callable[[], Awaitable[None]]] | None = None,
) -> Litestar:
    max_body = service.limits.max_body_bytes
    keys = frozenset(api_keys)

    def check_auth(request: Request[Any, Any, Any]) -> None:
        if not keys:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or token not in keys:
            raise Unauthorized("missing or invalid API key: send `Authorization: Bearer <key>`")

    async def read_body(request: Request[Any, Any, Any]) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body:
            raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {max_body}", None,
                                  "request_too_large")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                raise PayloadTooLarge(f"request body exceeds the limit of {max_body} bytes", None,
                                      "request_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    @post("/v1/chat/completions", status_code=200)
    async def chat_completions(request: Request[Any, Any, Any]) -> Response[bytes] | Stream:
        check_auth(request)
        raw = await read_body(request)
        req = decode_chat_request(raw)
        max_tokens = service.validate(req)
        decision = service.decide(req, request.headers.get("x-cascade-quality"))
        service.admit()
        if req.stream:
            try:
                frames = await service.open_stream(req, decision, max_tokens)
            except BaseException:
                service.release()
                raise
            # In cascade mode the headers leave before any tier answered: they name the first tier and
            # say the stream may escalate; its chunks' `model` and `cascade` name the tier that answered.
            headers = {"X-Cascade-Tier": decision.tier.name, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            if decision.accept is not None:
                headers["X-Cascade-Mode"] = "cascade"
            return Stream(_released(frames, service), media_type="text/event-stream", headers=headers)
        try:
            completion = await _unless_disconnected(request, service.complete(req, decision, max_tokens))
        finally:
            service.release()
        return Response(_encode(completion), media_type=_JSON, headers={"X-Cascade-Tier": completion.model})

    @post("/v1/route", status_code=200)
    async def route(request: Request[Any, Any, Any]) -> Response[bytes]:
        """The routing decision for a chat request, without generating (same body as chat completions)."""
        check_auth(request)
        req = decode_chat_request(await read_body(request))
        service.validate(req)
        decision = service.decide(req, request.headers.get("x-cascade-quality"))
        return Response(_encode(service.route_decision(decision)), media_type=_JSON,
                        headers={"X-Cascade-Tier": decision.tier.name})

    @get("/v1/models")
    async def models() -> Response[bytes]:
        return Response(_encode(service.model_list()), media_type=_JSON)

    @get("/health")
    async def health() -> Response[bytes]:
        return Response(b'{"status":"ok"}', media_type=_JSON)

    @get("/ready")
    async def ready() -> Response[bytes]:
        report = await ready_check() if ready_check else {"tiers": {}}
        ok = all(report["tiers"].values())
        body = _encode({"status": "ready" if ok else "unavailable", **report})
        return Response(body, media_type=_JSON, status_code=200 if ok else 503)

    @get("/metrics")
    async def metrics() -> Response[bytes]:
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def handle_cascade_error(request: Request[Any, Any, Any], exc: CascadeError) -> Response[bytes]:
        status = status_for(exc)
        if status < 500:
            service.metrics.client_errors.labels(str(status)).inc()
        else:
            log.warning("%s %s -> %d: %s", request.method, request.url.path, status, exc.message)
        return _error(exc, status)

    def handle_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
        status = exc.status_code
        kind = "invalid_request_error" if status < 500 else "server_error"
        if status == 404:
            message = f"no route for {request.method} {request.url.path}"
        elif status == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = exc.detail
        return Response(error_response(message, kind), status_code=status, media_type=_JSON)

    def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
        # Never a traceback to the client; the log has it.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return Response(error_response("internal error in the gateway", "server_error"), status_code=500,
                        media_type=_JSON)

    return Litestar(
        route_handlers=[chat_completions, route, models, health, ready, metrics],
        exception_handlers={
            CascadeError: handle_cascade_error,
            HTTPException: handle_http_exception,
            Exception: handle_unexpected,
        },
        on_startup=on_startup or [],
        on_shutdown=on_shutdown or [],
        # We enforce our own limit (with an OpenAI error object); Litestar's would answer first.
        request_max_body_size=None,
        openapi_config=None,
        logging_config=None,  # logging is configured once by `cascade serve`, not by the framework
        debug=False,
    )


def decode_chat_request(raw: bytes) -> ChatCompletionRequest:
    if not raw.strip():
        raise InvalidRequest("request body is empty; send a JSON chat completion request", None, "invalid_json")
    try:
        return _decode_request(raw)
    except msgspec.ValidationError as exc:
        message, param = _validation_param(str(exc))
        raise InvalidRequest(message, param, "invalid_type") from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}", None, "invalid_json") from None


def _validation_param(message: str) -> tuple[str, str | None]:
    """msgspec: 'Expected `int`, got `str` - at `$.n`' -> ('... at `n`', 'n')."""
    text, _, where = message.partition(" - at `$")
    path = where.rstrip("`").lstrip(".") or None
    if text.startswith("Object contains unknown field"):
        field = text.split("`")[1]
        path = f"{path}.{field}" if path else field
        return f"unrecognized request argument supplied: `{path}`", path
    if text.startswith("Object missing required field"):
        field = text.split("`")[1]
        path = f"{path}.{field}" if path else field
        return f"missing required parameter: `{path}`", path
    return (f"invalid value for `{path}`: {text}" if path else text), path


def _error(exc: CascadeError, status: int) -> Response[bytes]:
    param = getattr(exc, "param", None)
    code = getattr(exc, "code", None)
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
            413: "invalid_request_error", 429: "rate_limit_error"}.get(status, "server_error")
    if status == 404:
        code, param = "model_not_found", "model"
    return Response(error_response(exc.message, kind, param, code), status_code=status, media_type=_JSON)


async def _released(frames: AsyncIterator[bytes], service: ChatService) -> AsyncIterator[bytes]:
    try:
        async for frame in frames:
            yield frame
    finally:
        aclose = getattr(frames, "aclose", None)
        if aclose is not None:
            await aclose()
        service.release()


async def _unless_disconnected(request: Request[Any, Any, Any], work: Awaitable[Any]) -> Any:
    """Run `work`, but cancel it (and so the upstream generation) if the client disconnects."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise asyncio.CancelledError("client disconnected")
        return task.result()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


async def _wait_disconnect(request: Request[Any, Any, Any]) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


__all__ = ["Decision", "create_app", "decode_chat_request"]
