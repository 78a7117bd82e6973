"""The gateway app: Litestar routes over ChatService (chat completions and the Responses API's create in front of it
as plain ASGI, cascade/gateway/chat_asgi.py), OpenAI error objects for every failure."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from litestar import HttpMethod, Litestar, Request, Response, get, post
from litestar import route as litestar_route
from litestar.exceptions import HTTPException
from litestar.params import FromPath

from cascade.config import ResponsesConfig
from cascade.errors import CascadeError
from cascade.gateway.chat_asgi import ChatCompletionsASGI
from cascade.gateway.docs_page import docs_html
from cascade.gateway.monitoring import readiness
from cascade.gateway.openapi import gateway_document
from cascade.service.chat import ChatService
from cascade.service.errors import error_reply, error_response, internal_error
from cascade.service.model_ids import model_card
from cascade.service.responses_api.service import ResponsesService
from cascade.service.responses_api.store import LocalResponseStore

log = logging.getLogger("cascade.gateway")
_encode = msgspec.json.Encoder().encode
_JSON = "application/json"


METRICS_NOT_HERE = ("/metrics is not served on the clients' port of a gateway with API keys reachable from the "
                    "network (its series name each key's requests, tokens and spend): set [gateway] monitoring_port "
                    "to serve it on a port of its own, or [gateway] metrics_on_client_port = true")


def create_app(
    service: ChatService,
    ready_check: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    on_startup: list[Callable[[], Awaitable[None]]] | None = None,
    on_shutdown: list[Callable[[], Awaitable[None]]] | None = None,
    monitoring_port: int = 0,
    client_metrics: bool = True,
    responses: ResponsesService | None = None,
) -> ChatCompletionsASGI:
    """The routes over `service`, which holds the API keys (`service.keyring`). `monitoring_port`: when set, /metrics
    and /ready's detail are served there (cascade/gateway/monitoring.py), not here. `client_metrics` false without
    one: /metrics here is a 404 that says how to serve it (cascade/gateway/server.py `client_port_metrics`).
    `responses`: the Responses API over `service` (None: one that keeps its responses in this process)."""
    stored = responses or ResponsesService(service, LocalResponseStore(ResponsesConfig()))

    @post("/v1/route", status_code=200)
    async def route(request: Request[Any, Any, Any]) -> Response[bytes]:
        """The routing decision for a chat request, without generating (same body as chat completions): the key's
        permits and rate limits apply as they would to the chat completion (it counts as one request)."""
        headers = request.headers
        caller, req = await service.intake(headers.get("authorization", ""), request.stream(),
                                           headers.get("content-length"))
        decision = await service.route(req, caller=caller, hint_header=request.headers.get("x-cascade-quality"),
                                       admit=True)
        return Response(_encode(decision), media_type=_JSON, headers={"X-Cascade-Tier": decision.tier_name})

    # One handler for both methods: Litestar's OPTIONS and 405 then name both in `Allow`.
    @litestar_route("/v1/responses/{response_id:str}", http_method=[HttpMethod.GET, HttpMethod.DELETE], status_code=200)
    async def stored_response(request: Request[Any, Any, Any], response_id: FromPath[str]) -> Response[bytes]:
        """A stored response (GET), or its deletion (DELETE), for the API key that created it."""
        authorization = request.headers.get("authorization", "")
        if request.method == HttpMethod.DELETE:
            return Response(await stored.delete(authorization, response_id), media_type=_JSON)
        return Response(await stored.retrieve(authorization, response_id), media_type=_JSON)

    @get("/v1/models")
    async def models() -> Response[bytes]:
        return Response(_encode(service.model_list()), media_type=_JSON)

    # `path`: a tier's name may hold `/` (`Qwen/Qwen3-8B`); the server has percent-decoded it.
    @get("/v1/models/{model_id:path}")
    async def model(model_id: FromPath[str]) -> Response[bytes]:
        return Response(_encode(model_card(model_id.removeprefix("/"), service.model_list())), media_type=_JSON)

    @get("/health")
    async def health() -> Response[bytes]:
        return Response(b'{"status":"ok"}', media_type=_JSON)

    @get("/ready")
    async def ready() -> Response[bytes]:
        status, report = await readiness(ready_check)
        # With a monitoring port, the detail (tiers, unhealthy replicas) is for it only: this port is the clients'.
        body = _encode({"status": report["status"]} if monitoring_port else report)
        return Response(body, media_type=_JSON, status_code=status)

    @get("/metrics")
    async def metrics() -> Response[bytes]:
        if not client_metrics:
            return Response(error_response(METRICS_NOT_HERE, "invalid_request_error"), status_code=404,
                            media_type=_JSON)
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    monitoring = [] if monitoring_port else [metrics]  # on the monitoring port instead: a 404 here

    # Encoded once; Litestar's own OpenAPI is off.
    document = gateway_document(service, auth=bool(service.keyring),
                                monitoring_port=bool(monitoring_port) or not client_metrics)
    openapi_body, docs_body = _encode(document), docs_html(document)

    @get("/openapi.json")
    async def openapi() -> Response[bytes]:
        return Response(openapi_body, media_type=_JSON)

    @get("/docs")
    async def docs() -> Response[bytes]:
        return Response(docs_body, media_type="text/html; charset=utf-8")

    def handle_cascade_error(request: Request[Any, Any, Any], exc: CascadeError) -> Response[bytes]:
        status, body, extra = error_reply(exc, service.metrics, request.method, request.url.path)
        return Response(body, status_code=status, media_type=_JSON,
                        headers={k.decode("latin-1"): v.decode("latin-1") for k, v in extra} or None)

    def handle_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
        status = exc.status_code
        kind = "invalid_request_error" if status < 500 else "server_error"
        if status == 404:
            message = f"no route for {request.method} {request.url.path}"
        elif status == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = exc.detail
        # Litestar's 405 names the allowed methods in its headers (RFC 9110 requires `Allow`).
        headers = {"allow": exc.headers["allow"]} if status == 405 and exc.headers and "allow" in exc.headers else None
        return Response(error_response(message, kind), status_code=status, media_type=_JSON, headers=headers)

    def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
        return Response(internal_error(request.method, request.url.path), status_code=500, media_type=_JSON)

    litestar = Litestar(
        route_handlers=[route, stored_response, models, model, health, ready, *monitoring, openapi, docs],
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
    # The hot route bypasses the framework (cascade/gateway/chat_asgi.py says why).
    return ChatCompletionsASGI(litestar, service, stored)
