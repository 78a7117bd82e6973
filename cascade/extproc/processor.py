"""Envoy's external-processing gRPC service (envoy.service.ext_proc.v3.ExternalProcessor/Process) over the picker.

Envoy opens one stream per HTTP request and, as the filter is configured (cascade/deploy/envoy.py:
request headers SEND, request body BUFFERED, nothing of the response), sends the request headers, then the whole
body; each message gets exactly one answer:

    request_headers  kept; answered "continue" (a request without a body is decided here: it is refused)
    request_body     the picker's verdict: Routed -> `x-cascade-tier` set, the body replaced, the route cache
                     cleared (Envoy matches the route again, now on the header); Refused -> an immediate response
                     (status, OpenAI error body), which Envoy returns to the client; None -> unchanged
    anything else    answered unchanged (a filter configured to send more than cascade asks for still works)

Protocol types: the envoy-data-plane package (betterproto2 dataclasses of Envoy's API, with their own wire codec);
server: grpcio's asyncio server (its C core speaks HTTP/2: ~1.5 ms less per request than grpclib's pure-Python h2
in benchmarks/frontdoor/extproc_latency.py on this machine), which also answers the standard gRPC health check
(Kubernetes' grpc probe). Its Prometheus series (cascade/extproc/metrics.py) are served over plain HTTP on another port.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator

import grpc
from envoy_data_plane.envoy.config.core.v3 import HeaderValue, HeaderValueOption, HeaderValueOptionHeaderAppendAction
from envoy_data_plane.envoy.service.ext_proc.v3 import (
    BodyMutation,
    BodyResponse,
    CommonResponse,
    CommonResponseResponseStatus,
    HeaderMutation,
    HeadersResponse,
    ImmediateResponse,
    ProcessingRequest,
    ProcessingResponse,
    TrailersResponse,
)
from envoy_data_plane.envoy.type.v3 import HttpStatus, StatusCode
from grpclib.health.v1 import health_pb2  # the standard health messages (protobuf), shipped with grpclib

from cascade.extproc.metrics import MetricsListener
from cascade.extproc.picker import Refused, Routed, TierPicker, Verdict
from cascade.service.errors import error_response

log = logging.getLogger("cascade.extproc")
SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
_OVERWRITE = HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD


class Exchange:
    """One HTTP request's stream: its headers, kept until its body arrives."""

    def __init__(self, picker: TierPicker) -> None:
        self.picker = picker
        self.headers: dict[str, str] = {}

    async def answer(self, message: ProcessingRequest) -> ProcessingResponse:
        if (headers := message.request_headers) is not None:
            fields = headers.headers.headers if headers.headers is not None else []
            self.headers = {h.key.lower(): (h.raw_value.decode("latin-1") if h.raw_value else h.value) for h in fields}
            if headers.end_of_stream:  # no body: decided now
                return _reply(await self.picker.pick(self.headers, b""), body=False)
            return ProcessingResponse(request_headers=HeadersResponse())
        if (body := message.request_body) is not None:
            if not body.end_of_stream:  # BUFFERED_PARTIAL past the buffer, or STREAMED: not the whole body
                text = "request body exceeds the proxy's buffer (its per-connection buffer limit)"
                self.picker.metrics.refused(413)
                return _reply(Refused(status=413, body=error_response(text, "invalid_request_error", None,
                                                                      "request_too_large")), body=True)
            return _reply(await self.picker.pick(self.headers, body.body), body=True)
        return _unchanged(message)


def _reply(verdict: Verdict, *, body: bool) -> ProcessingResponse:
    """The answer to the request's headers (`body` False) or body message."""
    match verdict:
        case Refused():
            headers = [("content-type", "application/json"), *verdict.headers]
            return ProcessingResponse(immediate_response=ImmediateResponse(
                status=HttpStatus(code=StatusCode(verdict.status)), headers=_mutation(headers, ()),
                body=verdict.body, details=f"cascade_refused_{verdict.status}"))
        case Routed():
            common = CommonResponse(
                # Answering the headers, a body is replaced only with CONTINUE_AND_REPLACE.
                status=CommonResponseResponseStatus.CONTINUE if body else
                CommonResponseResponseStatus.CONTINUE_AND_REPLACE,
                header_mutation=_mutation(verdict.set_headers, verdict.remove_headers),
                body_mutation=BodyMutation(body=verdict.body), clear_route_cache=True)
            log.debug("%s -> %s%s", verdict.decision.quality, verdict.tier, " via the gateway" * verdict.via_gateway)
            if body:
                return ProcessingResponse(request_body=BodyResponse(response=common))
            return ProcessingResponse(request_headers=HeadersResponse(response=common))
    if body:
        return ProcessingResponse(request_body=BodyResponse())
    return ProcessingResponse(request_headers=HeadersResponse())


def _mutation(set_headers: tuple[tuple[str, str], ...] | list[tuple[str, str]], remove: tuple[str, ...]
              ) -> HeaderMutation:
    options = [HeaderValueOption(header=HeaderValue(key=k, raw_value=v.encode("latin-1")), append_action=_OVERWRITE)
               for k, v in set_headers]
    return HeaderMutation(set_headers=options, remove_headers=list(remove))


def _unchanged(message: ProcessingRequest) -> ProcessingResponse:
    if message.response_headers is not None:
        return ProcessingResponse(response_headers=HeadersResponse())
    if message.response_body is not None:
        return ProcessingResponse(response_body=BodyResponse())
    if message.request_trailers is not None:
        return ProcessingResponse(request_trailers=TrailersResponse())
    return ProcessingResponse(response_trailers=TrailersResponse())


async def process(picker: TierPicker, messages: AsyncIterator[ProcessingRequest]) -> AsyncIterator[ProcessingResponse]:
    """One ext_proc stream: an answer per message, in order."""
    exchange = Exchange(picker)
    streams = picker.metrics.streams
    streams.inc()
    try:
        async for message in messages:
            if message.observability_mode:
                continue  # answers would be ignored
            try:
                yield await exchange.answer(message)
            except Exception:  # a bug must not become a hung stream: the client gets a 500 OpenAI error
                log.exception("ext_proc: unexpected error")
                picker.metrics.refused(500)
                yield _reply(Refused(status=500, body=error_response("internal error in the model picker",
                                                                     "server_error")), body=True)
    finally:
        streams.dec()


def handlers(picker: TierPicker) -> tuple[grpc.GenericRpcHandler, ...]:
    """The ext_proc service, and the standard gRPC health check (always SERVING once listening)."""

    async def stream(requests: AsyncIterator[ProcessingRequest], context: object
                     ) -> AsyncIterator[ProcessingResponse]:
        async for response in process(picker, requests):
            yield response

    async def check(request: object, context: object) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    ext_proc = grpc.stream_stream_rpc_method_handler(stream, request_deserializer=ProcessingRequest.FromString,
                                                     response_serializer=ProcessingResponse.SerializeToString)
    health = grpc.unary_unary_rpc_method_handler(check, request_deserializer=health_pb2.HealthCheckRequest.FromString,
                                                 response_serializer=health_pb2.HealthCheckResponse.SerializeToString)
    return (grpc.method_handlers_generic_handler(SERVICE, {"Process": ext_proc}),
            grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": health}))


async def serve(picker: TierPicker, host: str, port: int, grace_s: float = 5.0, metrics_port: int = 0) -> None:
    """Serve ext_proc (and the gRPC health check) on host:port until SIGINT/SIGTERM, then let the streams in
    flight finish (at most `grace_s`). `metrics_port` (0: none): `/metrics` and `/health` over plain HTTP on host."""
    # A message carries the whole body (and its rewrite): room for the largest body the gateway accepts.
    size = max(4 << 20, 2 * picker.service.limits.max_body_bytes)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", size),
                                      ("grpc.max_send_message_length", size)])
    server.add_generic_rpc_handlers(handlers(picker))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    # After the handlers: gRPC listens from here on, so a SIGTERM sent once the port answers is a clean stop (one
    # sent in between meets the default action and kills the process: a test under load once saw it exit non-zero).
    server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    listener = MetricsListener(picker.metrics, host, metrics_port).start() if metrics_port else None
    try:
        await picker.start()
        try:
            await server.start()
            log.info("cascade extproc: ext_proc gRPC on %s:%d, tiers %s%s", host, port,
                     ", ".join(e.tier for e in picker.engines),
                     f"; /metrics and /health on port {metrics_port}" if listener else "")
            await stopping.wait()
            await server.stop(grace_s)
        finally:
            await picker.aclose()
    finally:
        if listener is not None:
            listener.stop()
