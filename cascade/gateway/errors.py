"""CascadeError classes to HTTP statuses and OpenAI error bodies."""

from __future__ import annotations

import msgspec

from cascade.errors import (
    BackendFailed,
    BackendTimeout,
    BackendUnavailable,
    CascadeError,
    InvalidRequest,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    UnknownModel,
)
from cascade.schemas import ErrorBody, ErrorResponse

# Most specific first: PayloadTooLarge is an InvalidRequest.
_STATUS: tuple[tuple[type[CascadeError], int], ...] = (
    (PayloadTooLarge, 413),
    (InvalidRequest, 400),
    (Unauthorized, 401),
    (UnknownModel, 404),
    (Overloaded, 429),
    (BackendFailed, 502),
    (BackendUnavailable, 503),
    (BackendTimeout, 504),
)


def status_for(exc: CascadeError) -> int:
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_response(message: str, kind: str, param: str | None = None, code: str | None = None) -> bytes:
    return msgspec.json.encode(ErrorResponse(error=ErrorBody(message=message, type=kind, param=param, code=code)))
