"""The CLIENT span of one upstream chat call, named and attributed per OpenTelemetry's GenAI semantic conventions
(gen-ai-spans): one per call the gateway makes to an engine, so one per tier attempt, escalated draft, failover
retry and reasoning branch.

    name        "chat {gen_ai.request.model}"
    always      gen_ai.operation.name ("chat"), gen_ai.provider.name ("openai", "sglang" or "transformers": the
                backend's kind), gen_ai.request.model, gen_ai.request.max_tokens (and temperature, top_p, seed when
                set), server.address, server.port, cascade.backend (the replica: tier/index)
    at its end  gen_ai.usage.input_tokens, gen_ai.usage.output_tokens (the engine's counts, else one per text
                chunk), gen_ai.response.finish_reasons; error.type (the exception's type) when it failed
    opt-in      gen_ai.input.messages, gen_ai.output.messages (`[gateway.tracing] capture_text = true` only)

A call its consumer closed early (a pruned or stopped branch, a client gone) ends without finish reasons and without
error.type: its branch span says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
from opentelemetry.trace import SpanKind, Status, StatusCode

if TYPE_CHECKING:
    from cascade.tracing.otel import OTelTracer

_encode = msgspec.json.Encoder().encode


class ChatMessage(Protocol):
    @property
    def role(self) -> str: ...

    def text(self) -> str: ...


class ChatRequest(Protocol):
    """What the span reads of a generation request (cascade/branches/backend.py GenerationRequest)."""

    @property
    def messages(self) -> Sequence[ChatMessage]: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def temperature(self) -> float | None: ...
    @property
    def top_p(self) -> float | None: ...
    @property
    def seed(self) -> int | None: ...


class ChatDelta(Protocol):
    """What the span reads of a stream delta (cascade/branches/backend.py StreamDelta)."""

    @property
    def text(self) -> str: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def chunks(self) -> int: ...


class UpstreamCall:
    __slots__ = ("_chunks", "_finish", "_input_tokens", "_output_tokens", "_text", "headers", "span")

    def __init__(self, tracer: OTelTracer, provider: str, model: str, address: str, port: int, backend: str,
                 request: ChatRequest, headers: Mapping[str, str]) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": provider, "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": request.max_tokens, "server.address": address, "server.port": port,
            "cascade.backend": backend}
        for key, value in (("temperature", request.temperature), ("top_p", request.top_p), ("seed", request.seed)):
            if value is not None:
                attributes[f"gen_ai.request.{key}"] = value
        if tracer.capture_text:
            attributes["gen_ai.input.messages"] = _encode(
                [{"role": m.role, "parts": [{"type": "text", "content": m.text()}]} for m in request.messages]
            ).decode()
        self.span = tracer.start(f"chat {model}", SpanKind.CLIENT, attributes)
        carrier = dict(headers)
        self.span.inject(carrier)
        self.headers = carrier  # the call's headers: the backend's and the span's traceparent (and tracestate)
        self._text: list[str] | None = [] if tracer.capture_text else None
        self._input_tokens: int | None = None
        self._output_tokens: int | None = None
        self._chunks = 0
        self._finish: str | None = None

    def saw(self, delta: ChatDelta) -> None:
        if delta.prompt_tokens is not None:
            self._input_tokens = delta.prompt_tokens
        if delta.completion_tokens is not None:
            self._output_tokens = delta.completion_tokens
        if delta.text:
            self._chunks += delta.chunks
            if self._text is not None:
                self._text.append(delta.text)
        if delta.finish_reason is not None:
            self._finish = delta.finish_reason

    def end(self, exc: BaseException | None = None) -> None:
        span = self.span
        if span.is_recording():
            attributes: dict[str, Any] = {"gen_ai.usage.output_tokens": self._output_tokens
                                          if self._output_tokens is not None else self._chunks}
            if self._input_tokens is not None:
                attributes["gen_ai.usage.input_tokens"] = self._input_tokens
            if self._finish is not None:
                attributes["gen_ai.response.finish_reasons"] = [self._finish]
            if self._text is not None:
                attributes["gen_ai.output.messages"] = _encode([{
                    "role": "assistant", "parts": [{"type": "text", "content": "".join(self._text)}],
                    "finish_reason": self._finish or ""}]).decode()
            span.set_attributes(attributes)
            if exc is not None and (kind := error_type(exc)) is not None:
                span.set_attribute("error.type", kind)
                span.set_status(Status(StatusCode.ERROR))
        span.end()


def error_type(exc: BaseException) -> str | None:
    """error.type for a failure: the exception's type name; None for a cancellation or a consumer that closed the
    stream early, which are no failure of the span's operation."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return None
    return type(exc).__name__
