"""The ext_proc service: Envoy's messages in (envoy-data-plane types), the picker's verdict out as Envoy reads it:
a header and body mutation that clears the route cache, or an immediate response with an OpenAI error. Once in
process (`Exchange`), once over real gRPC (grpcio, loopback)."""

from __future__ import annotations

import asyncio
import json

import grpc
from envoy_data_plane.envoy.config.core.v3 import HeaderMap, HeaderValue
from envoy_data_plane.envoy.service.ext_proc.v3 import (
    HttpBody,
    HttpHeaders,
    ProcessingRequest,
    ProcessingResponse,
)
from grpclib.health.v1 import health_pb2

from cascade.config import decode_config
from cascade.extproc.picker import TierPicker
from cascade.extproc.processor import SERVICE, Exchange, handlers
from tests.extproc.extproc_setup import TOML, chat


def headers(path: str = "/v1/chat/completions", method: str = "POST", end: bool = False,
            **extra: str) -> ProcessingRequest:
    fields = {":path": path, ":method": method, "content-type": "application/json",
              **{k.replace("_", "-"): v for k, v in extra.items()}}
    return ProcessingRequest(request_headers=HttpHeaders(
        headers=HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in fields.items()]),
        end_of_stream=end))


def body(raw: bytes, end: bool = True) -> ProcessingRequest:
    return ProcessingRequest(request_body=HttpBody(body=raw, end_of_stream=end))


def exchange(*messages: ProcessingRequest) -> list[ProcessingResponse]:
    async def run() -> list[ProcessingResponse]:
        ex = Exchange(TierPicker(decode_config(TOML)))
        return [await ex.answer(m) for m in messages]

    return asyncio.run(run())


def set_headers(response: ProcessingResponse) -> dict[str, str]:
    assert response.request_body is not None and response.request_body.response is not None
    mutation = response.request_body.response.header_mutation
    assert mutation is not None
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers if h.header is not None}


def test_the_headers_are_kept_and_the_body_answer_names_the_tier_replaces_the_body_and_clears_the_route() -> None:
    first, second = exchange(headers(x_cascade_quality="best"), body(chat()))
    assert first.request_headers is not None and first.request_headers.response is None  # continue, unchanged
    assert second.request_body is not None and second.request_body.response is not None
    common = second.request_body.response
    assert common.clear_route_cache and common.body_mutation is not None and common.body_mutation.body is not None
    assert json.loads(common.body_mutation.body)["model"] == "m-large"
    assert set_headers(second)["x-cascade-tier"] == "large"
    assert set_headers(second)["content-length"] == str(len(common.body_mutation.body))


def test_a_malformed_body_is_an_immediate_400_with_an_openai_error() -> None:
    _, answer = exchange(headers(), body(b'{"model": "cascade", "messages": ['))
    immediate = answer.immediate_response
    assert immediate is not None and immediate.status is not None and int(immediate.status.code) == 400
    assert json.loads(immediate.body)["error"]["code"] == "invalid_json"
    assert immediate.headers is not None
    assert {h.header.key: h.header.raw_value for h in immediate.headers.set_headers if h.header} == {
        "content-type": b"application/json"}


def test_a_request_without_a_body_is_refused_at_its_headers_and_other_paths_pass_unchanged() -> None:
    (empty,) = exchange(headers(end=True))
    assert empty.immediate_response is not None and int(empty.immediate_response.status.code) == 400  # type: ignore[union-attr]
    (models,) = exchange(headers("/v1/models", "GET", end=True))
    assert models.request_headers is not None and models.request_headers.response is None


def test_a_partial_body_is_413_not_a_decision_on_half_a_request() -> None:
    _, answer = exchange(headers(), body(chat()[:10], end=False))
    assert answer.immediate_response is not None and int(answer.immediate_response.status.code) == 413  # type: ignore[union-attr]


def test_over_grpc_each_message_gets_its_answer_in_order_and_the_health_check_serves() -> None:
    async def run() -> tuple[list[ProcessingResponse], int]:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(handlers(TierPicker(decode_config(TOML))))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.stream_stream(f"/{SERVICE}/Process", request_serializer=ProcessingRequest.SerializeToString,
                                             response_deserializer=ProcessingResponse.FromString)
                answers = [r async for r in call(iter([headers(), body(chat(quality="fast"))]), timeout=10)]
                check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                            response_deserializer=health_pb2.HealthCheckResponse.FromString)
                health = await check(health_pb2.HealthCheckRequest(), timeout=10)
                return answers, health.status
        finally:
            await server.stop(0)

    (first, second), status = asyncio.run(run())
    assert first.request_headers is not None
    assert set_headers(second)["x-cascade-tier"] == "small"
    assert status == health_pb2.HealthCheckResponse.SERVING
