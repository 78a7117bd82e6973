"""Errors raised by cascade's core. No HTTP codes here: the gateway maps classes to statuses."""

from __future__ import annotations


class CascadeError(Exception):
    """Base class: `message` is safe to show to a client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(CascadeError):
    """The client sent something we cannot serve; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class PayloadTooLarge(InvalidRequest):
    pass


class UnknownModel(CascadeError):
    def __init__(self, model: str, known: list[str]) -> None:
        shown = model if len(model) <= 100 else model[:100] + "..."  # never echo a client's megabytes
        super().__init__(f"The model `{shown}` does not exist. Available models: {', '.join(known)}.")
        self.model = model


class UnknownResponse(CascadeError):
    """A stored response (`/v1/responses`) that is not there for this caller: never written, expired, deleted, or
    another API key's (the same answer for each, so that a caller learns nothing of another key's ids). `param` names
    where the id came from (`previous_response_id`, or the path's `response_id`)."""

    def __init__(self, response_id: str, param: str) -> None:
        shown = response_id if len(response_id) <= 100 else response_id[:100] + "..."
        super().__init__(f"Response with id '{shown}' not found.")
        self.param = param


class Unauthorized(CascadeError):
    pass


class Forbidden(CascadeError):
    """The API key is valid but may not use what the request asks for (a quality hint, a tier)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class Overloaded(CascadeError):
    """Admission control refused the request; the client should retry later (`retry_after_s`)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RateLimited(Overloaded):
    """An API key is over its `limit` ("requests" or "tokens" per minute); `headers` are the x-ratelimit-* ones."""

    def __init__(self, message: str, limit: str, retry_after_s: float, headers: list[tuple[bytes, bytes]]) -> None:
        super().__init__(message, retry_after_s)
        self.limit = limit
        self.code = "rate_limit_exceeded"
        self.headers = headers


class QuotaExceeded(Overloaded):
    """An API key has spent its budget for the period (`[[gateway.keys]] budget`): OpenAI's 429 with type and code
    `insufficient_quota`; `retry_after_s` is until the budget resets."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s)
        self.code = "insufficient_quota"


class LimitsUnavailable(CascadeError):
    """The shared store of the limits (`[gateway.redis] url`) did not answer and its `failure = "closed"`: the
    request is refused (a 503) rather than admitted uncounted; the client should retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.code = "limits_unavailable"


class StoredResponsesUnavailable(CascadeError):
    """The Redis that keeps the stored responses (`[gateway.redis] url`) did not answer: a conversation is there or
    nowhere, so the request is refused (a 503) rather than answered without its history."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.code = "responses_unavailable"


class BackendError(CascadeError):
    """Base class for faults of an upstream engine, never of the client."""

    def __init__(self, message: str, backend: str = "") -> None:
        super().__init__(message)
        self.backend = backend


class BackendUnavailable(BackendError):
    """Nothing to talk to: connection refused, or no healthy replica (worth retrying after
    `retry_after_s`, e.g. when a benched replica will be probed again)."""

    def __init__(self, message: str, backend: str = "", retry_after_s: float = 1.0) -> None:
        super().__init__(message, backend)
        self.retry_after_s = retry_after_s


class BackendTimeout(BackendError):
    """The engine did not answer (or stopped streaming) within the configured time."""


class BackendFailed(BackendError):
    """The engine answered with an error status or a response we cannot parse."""


class UsageFault(BackendFailed):
    """The engine reported usage no engine could truthfully report for the request (negative, or past what the
    request could hold or produce): its count never reaches a bill, and the request is charged its reservation."""


class ConfigError(CascadeError):
    """A config, plan or CLI argument is wrong; the message names the key."""
