"""The gateway's OpenAPI 3.1 document, built from the msgspec wire types in cascade/schemas.py.

The component schemas are msgspec's (`msgspec.json.schema_components`), so they cannot drift from the
decoder; on top of them the request schema carries the limits `ChatService.validate` enforces (from
`[gateway.limits]`) and what a quality hint may be, so that a request the schema calls valid is one the
gateway serves. What JSON Schema cannot say (`branches.m <= branches.n`, a tier's branch slots) is a 400
naming the parameter. The app encodes the document once and serves it at `GET /openapi.json`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from cascade import __version__
from cascade.config import Limits
from cascade.gateway.openapi_responses import (
    RESPONSES_WIRE,
    constrain_responses_request,
    response_event_schema,
    responses_body,
)
from cascade.gateway.openapi_schemas import REF as _REF
from cascade.gateway.openapi_schemas import bound as _bound
from cascade.gateway.openapi_schemas import constrain_forwarded, quality_schema
from cascade.gateway.openapi_schemas import hint_text as _hint_text
from cascade.schemas import (
    EFFORT_LEVELS,
    EFFORT_NUMBER_MAX,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    RouteDecision,
)
from cascade.service.responses_api.service import RESPONSE_ID

if TYPE_CHECKING:
    from cascade.service.chat import ChatService

_ERRORS = {
    400: "Invalid request: malformed JSON, a wrong type, an unknown field or a value beyond the gateway's limits "
         "(`error.param` names the field).",
    401: "Missing or invalid API key.",
    408: "The request's headers or body did not arrive within `header_timeout_s` / `body_timeout_s`.",
    404: "Unknown model (`error.code` is `model_not_found`), or a stored response that is not there for this API key "
         "(`error.param` names where its id came from).",
    413: "The request body exceeds `[gateway.limits] max_body_bytes`.",
    429: "Overloaded: too many requests in flight (in all or on the tier), too many backend streams, or no "
         "branch slot within `max_slot_wait_s`.",
    431: "The request line and headers exceed `[gateway.limits] max_header_bytes`.",
    502: "A backend answered with an error or an unparsable response.",
    503: "No backend to talk to (connection refused, or every replica benched by its circuit breaker), the "
         "gateway's connections are all busy, the gateway is shutting down, or the Redis keeping stored responses "
         "does not answer.",
    504: "A backend did not answer (or stopped streaming) in time.",
}
_RETRY = (429, 503)


def openapi_document(model_ids: Sequence[str] = (), limits: Limits | None = None, auth: bool = False,
                     monitoring_port: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the gateway serving `model_ids` under `limits`; `auth`: it has API keys;
    `monitoring_port`: /metrics is served on another port (not this document's)."""
    limits = limits or Limits()
    wire = [ChatCompletionRequest, ChatCompletion, ChatCompletionChunk, RouteDecision, ModelList, ModelCard,
            ErrorResponse, *RESPONSES_WIRE]
    _, schemas = msgspec.json.schema_components(wire, ref_template=_REF)
    _constrain_request(schemas, limits, list(model_ids))
    constrain_responses_request(schemas, limits, list(model_ids))
    schemas["Health"] = {"type": "object", "properties": {"status": {"const": "ok"}}, "required": ["status"]}
    schemas["Readiness"] = _readiness_schema()
    schemas["ServerSentEvent"] = _event_schema()
    schemas["ResponseServerSentEvent"] = response_event_schema()
    chat_errors = (400, 401, 404, 408, 413, 429, 431, 502, 503, 504) if auth else \
        (400, 404, 408, 413, 429, 431, 502, 503, 504)
    route_errors = (400, 401, 404, 408, 413, 431, 503) if auth else (400, 404, 408, 413, 431, 503)
    tier_header = {"X-Cascade-Tier": {"description": "The tier that served the request (cascade mode: the first "
                                                     "tier tried; the body's `model` names the answering one).",
                                      "required": True, "schema": {"type": "string"}}}
    chat_ok = {
        "description": "The completion; with `stream: true`, server-sent events of `ChatCompletionChunk` JSON "
                       "ending with `data: [DONE]`.",
        "headers": {**tier_header, "X-Cascade-Mode": {
            "description": "`cascade` when the tier is decided only at the end of the stream.",
            "schema": {"type": "string", "enum": ["cascade"]}}, "X-Cascade-Dropped-Params": {
            "description": "The request's fields its engines were not sent (comma separated; `cascade.note` says "
                           "why), e.g. `store,ignore_eos`.", "schema": {"type": "string"}}},
        "content": {"application/json": {"schema": {"$ref": _REF.format(name="ChatCompletion")}},
                    "text/event-stream": {"schema": {"$ref": _REF.format(name="ServerSentEvent")}}},
    }
    security: list[dict[str, list[str]]] | None = [{"bearerAuth": []}] if auth else None
    stored_errors = (401, 404, 503) if auth else (404, 503)
    responses_ok = {
        "description": "The response; with `stream: true`, server-sent events (`event: TYPE`, `data: JSON`), each "
                       "numbered by `sequence_number`, ending with `response.completed` (or `response.incomplete`, "
                       "or `error` and `response.failed`).",
        "headers": chat_ok["headers"],
        "content": {"application/json": {"schema": {"$ref": _REF.format(name="ResponseObject")}},
                    "text/event-stream": {"schema": {"$ref": _REF.format(name="ResponseServerSentEvent")}}},
    }
    paths = {
        "/v1/chat/completions": {"post": _operation(
            "createChatCompletion", "A chat completion from the tier the quality hint and the router choose.",
            chat_ok, chat_errors, security, body=_request_body(model_ids))},
        "/v1/route": {"post": _operation(
            "routeChatCompletion", "The routing decision for a chat request, without generating.",
            {"description": "What the gateway would do with the request.", "headers": tier_header,
             "content": {"application/json": {"schema": {"$ref": _REF.format(name="RouteDecision")}}}},
            route_errors, security, body=_request_body(model_ids))},
        "/v1/responses": {"post": _operation(
            "createResponse", "A response (OpenAI's Responses API) from the tier the quality hint and the router "
            "choose, answered as the chat request it stands for; kept for `previous_response_id` and GET unless "
            "`store` is false.", responses_ok, chat_errors, security, body=responses_body(model_ids))},
        "/v1/responses/{response_id}": {
            "get": _stored("getResponse", "A stored response, for the API key that created it.",
                           _json_ok("The response as it was answered.", "ResponseObject"), stored_errors, security),
            "delete": _stored("deleteResponse", "Delete a stored response of this API key.",
                              _json_ok("It is gone.", "ResponseDeleted"), stored_errors, security)},
        "/v1/models": {"get": _operation(
            "listModels", "The tiers and the routed `cascade` aliases.", _json_ok("The models.", "ModelList"),
            (503,))},
        "/v1/models/{model_id}": {"get": _model()},
        "/health": {"get": _operation("health", "The process is up.", _json_ok("Up.", "Health"))},
        "/ready": {"get": _operation(
            "ready", "Whether this gateway can serve, from its engines' last background health checks (no engine "
            "is called).",
            _json_ok("Some tier can serve (`status`: `ready`, or `degraded` with the others under `unhealthy`).",
                     "Readiness"),
            extra={503: {"description": "No tier can serve, or the gateway is shutting down "
                                        "(`status`: `draining`).", "headers": _retry_after(),
                         "content": {"application/json": {"schema": {"$ref": _REF.format(name="Readiness")}}}}})},
        "/metrics": {"get": _operation("metrics", "Prometheus metrics.", {
            "description": "Prometheus text exposition format 0.0.4.",
            "content": {"text/plain": {"schema": {"type": "string"}}}})},
        "/openapi.json": {"get": _operation("openapi", "This document.", {
            "description": "The OpenAPI document.", "content": {"application/json": {"schema": {"type": "object"}}}},
            (503,))},
        "/docs": {"get": _operation("docs", "This API for people: its routes, and a link to this document.", {
            "description": "An HTML page.", "content": {"text/html": {"schema": {"type": "string"}}}}, (503,))},
    }
    if monitoring_port:
        del paths["/metrics"]
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "cascade", "version": __version__,
                 "description": "A reasoning-serving gateway: OpenAI-compatible chat completions routed to the "
                                "cheapest model tier that will answer well."},
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if auth:
        document["components"]["securitySchemes"] = {
            "bearerAuth": {"type": "http", "scheme": "bearer", "description":
                           "One of `[gateway] api_keys` or `[[gateway.keys]]`."}}
    return document


def gateway_document(service: ChatService, auth: bool, monitoring_port: bool = False) -> dict[str, Any]:
    """The document for `service`'s models and limits (the app encodes it once, and builds /docs from it)."""
    ids = [card.id for card in service.model_list().data]
    return openapi_document(ids, service.limits, auth, monitoring_port)


def _model() -> dict[str, Any]:
    operation = _operation("retrieveModel", "One model a chat request may name: a tier, `cascade` or "
                           "`cascade:<hint>`.", _json_ok("The model.", "ModelCard"), (404, 503))
    operation["parameters"] = [{"name": "model_id", "in": "path", "required": True,
                                "description": "The model's id, percent-encoded (at most 256 characters).",
                                "schema": {"type": "string", "maxLength": 256}}]
    return operation


def _operation(operation_id: str, summary: str, ok: dict[str, Any], errors: Sequence[int] = (),
               security: list[dict[str, list[str]]] | None = None, body: dict[str, Any] | None = None,
               extra: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": ok}
    for status in errors:
        response: dict[str, Any] = {
            "description": _ERRORS[status],
            "content": {"application/json": {"schema": {"$ref": _REF.format(name="ErrorResponse")}}}}
        if status in _RETRY:
            response["headers"] = _retry_after()
        responses[str(status)] = response
    for status, response in (extra or {}).items():
        responses[str(status)] = response
    operation: dict[str, Any] = {"operationId": operation_id, "summary": summary, "responses": responses}
    if body is not None:
        operation["parameters"] = [{
            "name": "X-Cascade-Quality", "in": "header", "required": False,
            "description": "Quality hint (after the body's `quality`, before a `cascade:<hint>` model alias and "
                           "`reasoning_effort`).",
            "schema": _hint_text()}]
        operation["requestBody"] = body
    if security is not None:
        operation["security"] = security
    return operation


def _stored(operation_id: str, summary: str, ok: dict[str, Any], errors: Sequence[int],
            security: list[dict[str, list[str]]] | None) -> dict[str, Any]:
    operation = _operation(operation_id, summary, ok, errors, security)
    operation["parameters"] = [{"name": "response_id", "in": "path", "required": True,
                                "description": "The response's `id` (`resp_` and 48 hex digits).",
                                # Its exact form: other text, an encoded slash among it, names no stored response.
                                "schema": {"type": "string", "pattern": "^" + RESPONSE_ID.pattern + "$"}}]
    return operation


def _json_ok(description: str, name: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": _REF.format(name=name)}}}}


def _retry_after() -> dict[str, Any]:
    return {"Retry-After": {"description": "Seconds to wait before retrying.", "required": False,
                            "schema": {"type": "integer", "minimum": 0}}}


def _request_body(model_ids: Sequence[str]) -> dict[str, Any]:
    model = next((m for m in model_ids if m.startswith("cascade:")), "cascade")
    tier = next((m for m in model_ids if m != "cascade" and not m.startswith("cascade:")), model)
    question = "A school has 17 classes with 23 students in each class. How many students are in the school?"
    examples = {
        "alias": {"summary": "A quality hint as a model alias",
                  "value": {"model": model, "messages": [{"role": "user", "content": "Say hello."}]}},
        "quality": {"summary": "A quality hint in the body",
                    "value": {"model": "cascade", "quality": "balanced",
                              "messages": [{"role": "user", "content": question}]}},
        "effort": {"summary": "OpenAI's reasoning_effort as the hint ([routing.effort]), with the token limit",
                   "value": {"model": "cascade", "reasoning_effort": "high", "max_completion_tokens": 1024,
                             "messages": [{"role": "user", "content": question}]}},
        "tier": {"summary": "A tier by name (bypasses routing), streamed",
                 "value": {"model": tier, "stream": True, "stream_options": {"include_usage": True},
                           "messages": [{"role": "user", "content": question}]}},
    }
    return {"required": True, "content": {"application/json": {
        "schema": {"$ref": _REF.format(name="ChatCompletionRequest")}, "examples": examples}}}


def _event_schema() -> dict[str, Any]:
    # OpenAPI 3.1 has a text/event-stream `schema` describe one event (3.2 names it `itemSchema`).
    return {"type": "object", "required": ["data"], "description": "One server-sent event of a streamed completion.",
            "properties": {
                "data": {"description": "A `ChatCompletionChunk` (a failure mid-stream: an `ErrorResponse`); the "
                                        "last event is `[DONE]`.",
                         "anyOf": [{"const": "[DONE]"}, {
                             "type": "string", "contentMediaType": "application/json",
                             "contentSchema": {"anyOf": [{"$ref": _REF.format(name="ChatCompletionChunk")},
                                                         {"$ref": _REF.format(name="ErrorResponse")}]}}]},
                "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"}}}


def _readiness_schema() -> dict[str, Any]:
    worker = {"type": "object", "properties": {
        "url": {"type": "string"}, "pid": {"type": ["integer", "null"]}, "alive": {"type": "boolean"},
        "restarts": {"type": "integer"}}}
    replica = {"type": "object", "properties": {
        "breaker": {"enum": ["closed", "half_open", "open"]}, "outstanding": {"type": "integer"},
        "consecutive_failures": {"type": "integer"}, "next_probe_s": {"type": ["number", "null"]},
        "health": {"enum": ["up", "down", "unknown"]}, "health_error": {"type": "string"}}}
    names = {"type": "array", "items": {"type": "string"}}
    return {"type": "object", "required": ["status"], "properties": {
        "status": {"enum": ["ready", "degraded", "unavailable", "draining"]},
        "tiers": {"type": "object", "additionalProperties": {"type": "boolean"},
                  "description": "Per tier: has a replica that is neither benched nor failing its health checks."},
        "unhealthy": {"type": "object", "properties": {"tiers": names, "replicas": names},
                      "description": "The tiers that cannot serve now, and the replicas benched or down."},
        "replicas": {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": replica},
                     "description": "Per tier, per replica: its circuit breaker and its engine's health."},
        "error": {"type": "string", "description": "Why the readiness check itself failed."},
        "workers": {"type": "object", "additionalProperties": worker,
                    "description": "The embedded workers `cascade serve` supervises."}}}


def _constrain_request(schemas: dict[str, Any], limits: Limits, model_ids: list[str]) -> None:
    """Add what `ChatService.validate` and the quality parser check to the request schemas (in place)."""
    request = schemas["ChatCompletionRequest"]["properties"]
    if model_ids:
        request["model"]["examples"] = model_ids
    request["messages"].update(minItems=1, maxItems=limits.max_messages)
    request["n"].update(minimum=1, maximum=limits.max_n)
    for name in ("max_tokens", "max_completion_tokens"):
        _bound(request[name], minimum=1, maximum=limits.max_tokens)
    _bound(request["temperature"], minimum=0, maximum=2)
    _bound(request["top_p"], exclusiveMinimum=0, maximum=1)
    _bound(request["stop"], maxItems=limits.max_stop_sequences)
    constrain_forwarded(request, limits)
    request["quality"] = quality_schema()
    request["reasoning_effort"] = _effort(
        "A quality hint as OpenAI's clients give one, below `quality`, X-Cascade-Quality and a `cascade:<hint>` "
        "alias ([routing.effort] maps each level), and the engine's thinking switch and budget. A level, or a number "
        "as SGLang takes one (the level its range falls in).")
    schemas["ReasoningRequest"]["properties"]["effort"] = _effort("`reasoning_effort`, nested (the Responses API's "
                                                                  "form); give one of the two.")
    # `stream_options` only with `stream: true`; one effort, top-level or nested.
    schemas["ChatCompletionRequest"].update({
        "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
        "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
        "not": {"required": ["reasoning_effort", "reasoning"], "properties": {
            "reasoning_effort": {"not": {"type": "null"}},
            "reasoning": {"type": "object", "required": ["effort"],
                          "properties": {"effort": {"not": {"type": "null"}}}}}}})
    branches = schemas["BranchOverride"]["properties"]
    _bound(branches["n"], minimum=1, maximum=limits.max_branches)
    _bound(branches["m"], minimum=1, maximum=limits.max_branches)
    _bound(branches["alpha"], minimum=0, maximum=1)
    _bound(branches["beta"], minimum=0, maximum=limits.max_branches)
    _bound(branches["k"], minimum=1, maximum=1000)


def _effort(description: str) -> dict[str, Any]:
    """An effort value: a level, or a number in [0, EFFORT_NUMBER_MAX] (other spellings of a level, its case and
    surrounding spaces, and numbers written as text are accepted too)."""
    return {"anyOf": [{"enum": list(EFFORT_LEVELS)}, {"type": "number", "minimum": 0, "maximum": EFFORT_NUMBER_MAX},
                      {"type": "null"}], "default": None, "description": description}

