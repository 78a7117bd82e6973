"""The tracer behind cascade/tracing's seam, on OpenTelemetry's SDK (the `otel` extra, imported only when tracing is
configured). Its own TracerProvider (never the process-global one), a parent-based ratio sampler, and OTLP/HTTP
export in batches from the SDK's background thread: the event loop never waits on the collector.

Spans (docs/operations.md, "Tracing"):
  SERVER   "POST /v1/chat/completions" and "POST /v1/route": http.request.method, http.route, url.scheme,
           server.address/port, client.address, http.response.status_code, cascade.tier (x-cascade-tier), error.type
           (a 5xx status, or the exception's type)
  INTERNAL "cascade.route" (the request core's decision: cascade/service/spans.py)
  INTERNAL "cascade.branches" (tier, n, m; a `vote` event) > "cascade.branch" (index, outcome, tokens, score;
           a `prune` or `stop` event when it was cut)
  CLIENT   "chat {model}", one per upstream call (cascade/tracing/genai.py)

The caller's `traceparent` (and `tracestate`) becomes the server span's parent when it is well-formed; anything else
(malformed, repeated, too long) is ignored and a new trace starts. Error attributes name types, never messages: an
engine's message may quote the prompt.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from cascade.config import TracingConfig
from cascade.tracing import BranchSpans
from cascade.tracing.genai import ChatRequest, UpstreamCall, error_type

Message = MutableMapping[str, Any]
ASGIApp = Callable[[Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

EXPORT_TIMEOUT_S = 10.0  # one OTLP/HTTP export at most
TRACEPARENT_MAX_CHARS = 256  # version 00 is 55 characters; a later version may append fields
TRACESTATE_MAX_CHARS = 512  # W3C Trace Context: a longer tracestate may be dropped
TRACESTATE_MAX_MEMBERS = 32
# W3C Trace Context's tracestate member (key=value), checked here so that a hostile one is dropped without a log line.
_KEY = r"[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13}"
_MEMBER = re.compile(rf"(?:{_KEY})=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{{0,255}}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")


class OTelTracer:
    def __init__(self, provider: TracerProvider, capture_text: bool = False) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("cascade")
        self.capture_text = capture_text
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def exporting(cls, config: TracingConfig) -> OTelTracer:
        """OTLP/HTTP (protobuf) to `config.endpoint`, in batches."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=config.endpoint, timeout=EXPORT_TIMEOUT_S)
        # The SDK's batching (512 spans per export; OTEL_BSP_* apply): 64 per export measured worse at 50 streams.
        return cls.to(BatchSpanProcessor(exporter), config.sampler_ratio, config.service_name, config.capture_text)

    @classmethod
    def to(cls, sink: SpanExporter | SpanProcessor, ratio: float = 1.0, service_name: str = "cascade",
           capture_text: bool = False) -> OTelTracer:
        """Spans to `sink`: a processor as it is, an exporter span by span (tests' in-memory one)."""
        processor = sink if isinstance(sink, SpanProcessor) else SimpleSpanProcessor(sink)
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)),
                                  resource=Resource.create({"service.name": service_name}))
        provider.add_span_processor(processor)
        return cls(provider, capture_text)

    def shutdown(self) -> None:
        """Export what is left and stop (blocks up to the exporter's timeout: call it off the event loop)."""
        self.provider.shutdown()

    # --- INTERNAL spans ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Span]:
        span = self.tracer.start_span(name, attributes=attributes)
        token = otel_context.attach(set_span_in_context(span))
        try:
            yield span
        except BaseException as exc:
            failed(span, exc)
            raise
        finally:
            otel_context.detach(token)
            span.end()

    @contextlib.contextmanager
    def branches(self, tier: str, n: int, m: int) -> Iterator[BranchSpans]:
        attributes = {"cascade.tier": tier, "cascade.branches.n": n, "cascade.branches.m": m}
        with self.span("cascade.branches", attributes) as span:
            spans = _BranchSpans(self, span)
            try:
                yield spans
            finally:
                for left_open in spans.spans.values():  # every branch leaves the race; this is a backstop
                    left_open.end()

    # --- CLIENT spans --------------------------------------------------------------------------------

    def upstream(self, provider: str, model: str, address: str, port: int, backend: str, request: ChatRequest,
                 headers: Mapping[str, str]) -> UpstreamCall:
        """A CLIENT span for one upstream chat call, started now; `headers` plus its traceparent are the call's."""
        return UpstreamCall(self, provider, model, address, port, backend, request, headers)

    # --- SERVER spans --------------------------------------------------------------------------------

    async def serve(self, app: ASGIApp, scope: Message, receive: Callable[[], Awaitable[Message]],
                    send: Callable[[Message], Awaitable[None]]) -> None:
        """Run the ASGI `app` on one HTTP request inside its SERVER span, and answer with the span's traceparent."""
        parent = self.propagator.extract(incoming(scope["headers"]))
        method, path = scope["method"], scope["path"]
        attributes: dict[str, Any] = {"http.request.method": method, "http.route": path, "url.path": path,
                                      "url.scheme": scope.get("scheme", "http")}
        if server := scope.get("server"):
            attributes["server.address"], attributes["server.port"] = server[0], server[1] or 0
        if client := scope.get("client"):
            attributes["client.address"] = client[0]
        span = self.tracer.start_span(f"{method} {path}", context=parent, kind=SpanKind.SERVER, attributes=attributes)
        traceparent = self.traceparent(span)
        token = otel_context.attach(set_span_in_context(span))

        async def send_traced(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                span.set_attribute("http.response.status_code", status)
                for name, value in message.get("headers", ()):
                    if name == b"x-cascade-tier":
                        span.set_attribute("cascade.tier", value.decode("latin-1"))
                if status >= 500:
                    span.set_attribute("error.type", str(status))
                    span.set_status(Status(StatusCode.ERROR))
                message = {**message, "headers": [*message.get("headers", ()), (b"traceparent", traceparent)]}
            await send(message)

        try:
            await app(scope, receive, send_traced)
        except BaseException as exc:
            failed(span, exc)
            raise
        finally:
            otel_context.detach(token)
            span.end()

    @staticmethod
    def traceparent(span: Span) -> bytes:
        c = span.get_span_context()
        return b"00-%032x-%016x-%02x" % (c.trace_id, c.span_id, c.trace_flags)


def incoming(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The request's trace context headers worth reading: one traceparent of at most TRACEPARENT_MAX_CHARS (the
    propagator checks its form), and a tracestate only beside it and only when it is well-formed W3C."""
    parents = [v for k, v in headers if k == b"traceparent"]
    if len(parents) != 1 or len(parents[0]) > TRACEPARENT_MAX_CHARS:
        return {}
    carrier = {"traceparent": parents[0].decode("latin-1")}
    states = [v for k, v in headers if k == b"tracestate"]
    state = b",".join(states).decode("latin-1")
    if states and tracestate_ok(state):
        carrier["tracestate"] = state
    return carrier


def tracestate_ok(value: str) -> bool:
    if len(value) > TRACESTATE_MAX_CHARS:
        return False
    members = [m for m in (part.strip(" \t") for part in value.split(",")) if m]
    keys = {m.partition("=")[0] for m in members}
    return (len(members) <= TRACESTATE_MAX_MEMBERS and len(keys) == len(members)
            and all(_MEMBER.fullmatch(m) for m in members))


def failed(span: Span, exc: BaseException) -> None:
    """Mark `span` failed by `exc`'s type (a cancellation or a consumer closing early is no failure)."""
    kind = error_type(exc)
    if kind is not None:
        span.set_attribute("error.type", kind)
        span.set_status(Status(StatusCode.ERROR))


class _BranchSpans(BranchSpans):
    """One "cascade.branch" span per launched branch, under the run's span."""

    def __init__(self, tracer: OTelTracer, run: Span) -> None:
        self.tracer = tracer
        self.run = run
        self.spans: dict[int, Span] = {}

    def context(self, index: int) -> contextvars.Context:
        span = self.tracer.tracer.start_span("cascade.branch", context=set_span_in_context(self.run),
                                             attributes={"cascade.branch.index": index})
        self.spans[index] = span
        context = contextvars.copy_context()
        context.run(otel_context.attach, set_span_in_context(span))  # current in that context only
        return context

    def left(self, index: int, state: str, tokens: int, score: float | None) -> None:
        span = self.spans.pop(index, None)
        if span is None:
            return
        event = {"pruned": "prune", "stopped": "stop"}.get(state)
        attributes: dict[str, Any] = {"cascade.branch.outcome": state, "cascade.branch.tokens": tokens}
        if score is not None:
            attributes["cascade.branch.score"] = score
        if event is not None:
            span.add_event(event, attributes)
        span.set_attributes(attributes)
        span.end()

    def voted(self, chosen: int, finished: int, votes: Mapping[str, int], answer: str | None) -> None:
        attributes: dict[str, Any] = {"cascade.branch.chosen": chosen, "cascade.branches.finished": finished,
                                      "cascade.branches.answers": len(votes),
                                      "cascade.branches.votes": max(votes.values(), default=0)}
        if self.tracer.capture_text and answer is not None:
            attributes["cascade.branches.answer"] = answer
        self.run.add_event("vote", attributes)
