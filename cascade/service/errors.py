"""CascadeError classes to HTTP statuses and OpenAI error bodies, and the reply every route gives to an error
(the Litestar routes and the plain-ASGI chat completions route alike)."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import msgspec

from cascade.errors import (
    BackendFailed,
    BackendTimeout,
    BackendUnavailable,
    CascadeError,
    Forbidden,
    InvalidRequest,
    LimitsUnavailable,
    Overloaded,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    StoredResponsesUnavailable,
    Unauthorized,
    UnknownModel,
    UnknownResponse,
)
from cascade.schemas import ErrorBody, ErrorResponse

if TYPE_CHECKING:
    from cascade.service.metrics import GatewayMetrics

log = logging.getLogger("cascade.gateway")

# Most specific first: PayloadTooLarge is an InvalidRequest.
_STATUS: tuple[tuple[type[CascadeError], int], ...] = (
    (PayloadTooLarge, 413),
    (InvalidRequest, 400),
    (Unauthorized, 401),
    (Forbidden, 403),
    (UnknownModel, 404),
    (UnknownResponse, 404),
    (Overloaded, 429),
    (BackendFailed, 502),
    (BackendUnavailable, 503),
    (LimitsUnavailable, 503),
    (StoredResponsesUnavailable, 503),
    (BackendTimeout, 504),
)


_REDIS_DOWN = (LimitsUnavailable, StoredResponsesUnavailable)


def status_for(exc: CascadeError) -> int:
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def retry_after(exc: CascadeError) -> list[tuple[bytes, bytes]]:
    """`Retry-After` (whole seconds) for a 429 or 503, as the header list of an ASGI response (with a key's
    x-ratelimit-* headers when it is over its limits)."""
    seconds = getattr(exc, "retry_after_s", None)
    if seconds is None or status_for(exc) not in (429, 503):
        return []
    extra = exc.headers if isinstance(exc, RateLimited) else []
    return [(b"retry-after", str(max(1, math.ceil(seconds))).encode()), *extra]


MAX_MESSAGE_CHARS = 1000  # an error message (which may quote input) is cut here
MAX_PARAM_CHARS = 200


def error_response(message: str, kind: str, param: str | None = None, code: str | None = None) -> bytes:
    """An OpenAI error body. Message and param are capped: both may quote what the client sent (a field
    name, a header), and an error must not echo megabytes back."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "... (truncated)"
    if param is not None and len(param) > MAX_PARAM_CHARS:
        param = param[:MAX_PARAM_CHARS] + "..."
    return msgspec.json.encode(ErrorResponse(error=ErrorBody(message=message, type=kind, param=param, code=code)))


def openai_error(exc: CascadeError, status: int) -> bytes:
    """The OpenAI error body for `exc` answered with `status`."""
    param = getattr(exc, "param", None)
    code = getattr(exc, "code", None)
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "invalid_request_error", 413: "invalid_request_error",
            429: "rate_limit_error"}.get(status, "server_error")
    if isinstance(exc, RateLimited):
        kind = exc.limit  # as OpenAI: "requests" or "tokens", code "rate_limit_exceeded"
    elif isinstance(exc, QuotaExceeded):
        kind = "insufficient_quota"  # as OpenAI, type and code alike
    elif status == 403:
        code = "permission_denied"
    if isinstance(exc, UnknownModel):
        code, param = "model_not_found", "model"
    return error_response(exc.message, kind, param, code)


def error_reply(exc: CascadeError, metrics: GatewayMetrics, method: str, path: str
                ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """Status, OpenAI error body and extra headers (`Retry-After`) for a request that failed with `exc`: a
    client's error is counted, a server-side one logged."""
    status = status_for(exc)
    if status < 500:
        metrics.client_errors.labels(str(status)).inc()
    elif not isinstance(exc, _REDIS_DOWN):  # logged where Redis failed, a line per 10 s, not per request
        log.warning("%s %s -> %d: %s", method, path, status, exc.message)
    return status, openai_error(exc, status), retry_after(exc)


def internal_error(method: str, path: str) -> bytes:
    """The 500 body for an unexpected exception, logged with its traceback (which never reaches the client).
    Call it from the `except` block."""
    log.exception("unhandled error on %s %s", method, path)
    return error_response("internal error in the gateway", "server_error")
