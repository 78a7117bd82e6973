"""The tracer behind cascade/tracing's seam, on OpenTelemetry's SDK (the `otel` extra, imported only when tracing is
configured). Spans are cascade's own light records (`RecordingSpan`, cheap on the event loop), handed when they end
to the SDK's span processor as its `ReadableSpan`s; sampling is the SDK's parent-based ratio rule; OTLP/HTTP export
in batches from the SDK's background thread: the event loop never waits on the collector. Nothing process-global:
no TracerProvider or context of OpenTelemetry's is set, so an application's own OpenTelemetry setup is untouched.

Spans (docs/operations.md, "Tracing"):
  SERVER   "POST /v1/chat/completions", "POST /v1/responses" and "POST /v1/route": http.request.method, http.route,
           url.scheme, server.address/port, client.address, http.response.status_code, cascade.tier (x-cascade-tier),
           error.type (a 5xx status, or the exception's type)
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
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState

from cascade.config import TracingConfig
from cascade.tracing.branch_spans import BranchSpans
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
_SAMPLED, _UNSAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)
_NO_STATE = TraceState()
_ERROR = Status(StatusCode.ERROR)
_UNSET = Status(StatusCode.UNSET)

# The span current in this task (and the tasks it starts): what a new span takes as its parent.
_current: contextvars.ContextVar[RecordingSpan | None] = contextvars.ContextVar("cascade_span", default=None)


def _new_id(bits: int) -> int:
    """A random trace or span id (the random module reseeds itself in a forked worker: `serve --processes`)."""
    while not (value := random.getrandbits(bits)):  # 0 is W3C's invalid id
        pass
    return value


class RecordingSpan:
    """One span, recorded as plain values while it runs and handed to the SDK's span processor as a finished
    `ReadableSpan` when it ends. Cheaper on the event loop than the SDK's own spans (no per-attribute checks, no
    locks, no sampler call per span: about a third of their CPU, benchmarks/frontdoor/tracing_cost.py), which matters on
    a gateway's hot path; what an exporter receives is the same. The attributes set here are cascade's own (str, bool,
    int, float, or lists of them), so they are not checked again. An unsampled span records nothing but still has ids
    to pass on."""

    __slots__ = ("_tracer", "attributes", "events", "flags", "kind", "name", "parent", "span_id", "start", "state",
                 "status", "trace_id")

    def __init__(self, tracer: OTelTracer, name: str, kind: SpanKind, parent: RecordingSpan | SpanContext | None,
                 attributes: Mapping[str, Any] | None) -> None:
        self._tracer = tracer
        self.name, self.kind = name, kind
        self.span_id = _new_id(64)
        if parent is None:  # a new trace: the ratio sampler's rule on its id
            self.trace_id = _new_id(128)
            self.flags = tracer.sampling(self.trace_id)
            self.state, self.parent = _NO_STATE, None
        elif isinstance(parent, RecordingSpan):
            self.trace_id, self.flags, self.state = parent.trace_id, parent.flags, parent.state
            self.parent = parent.context() if parent.flags.sampled else None  # an unsampled span reports nothing
        else:  # the caller's (remote) span: its sampling decision is followed, unless the gateway decides alone
            self.trace_id, self.state, self.parent = parent.trace_id, parent.trace_state, parent
            self.flags = parent.trace_flags if tracer.follow_caller else tracer.draw()
        self.attributes: dict[str, Any] | None = None
        if self.flags.sampled:
            self.attributes = {}
            if attributes:
                self.set_attributes(attributes)
        self.events: list[Event] = []
        self.status = _UNSET
        self.start = time.time_ns()

    def is_recording(self) -> bool:
        return self.attributes is not None

    def context(self) -> SpanContext:
        return SpanContext(self.trace_id, self.span_id, False, self.flags, self.state)

    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"

    def inject(self, carrier: dict[str, str]) -> None:
        """W3C trace context headers naming this span as the parent (what the SDK's propagator writes)."""
        carrier["traceparent"] = self.traceparent()
        if self.state:
            carrier["tracestate"] = self.state.to_header()

    def set_attribute(self, key: str, value: Any) -> None:
        if self.attributes is not None:
            self.attributes[key] = tuple(value) if type(value) is list else value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self.attributes is not None:
            for key, value in attributes.items():
                self.attributes[key] = tuple(value) if type(value) is list else value

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        if self.attributes is not None:
            self.events.append(Event(name, dict(attributes or {}), time.time_ns()))

    def set_status(self, status: Status) -> None:
        self.status = status

    def end(self) -> None:
        attributes, self.attributes = self.attributes, None  # ends once; later calls and sets do nothing
        if attributes is None:
            return
        tracer = self._tracer
        tracer.processor.on_end(ReadableSpan(
            self.name, self.context(), self.parent, tracer.resource, attributes, tuple(self.events), (), self.kind,
            status=self.status, start_time=self.start, end_time=time.time_ns(), instrumentation_scope=tracer.scope))


class OTelTracer:
    def __init__(self, processor: SpanProcessor, ratio: float = 1.0, service_name: str = "cascade",
                 capture_text: bool = False, follow_caller: bool = True) -> None:
        self.processor = processor
        self.bound = TraceIdRatioBased.get_bound_for_rate(ratio)  # the SDK's ratio sampler's rule
        self.follow_caller = follow_caller  # a caller's sampled flag decides (else the ratio, on its trace id)
        self.resource = Resource.create({"service.name": service_name})
        self.scope = InstrumentationScope("cascade")
        self.capture_text = capture_text
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def exporting(cls, config: TracingConfig) -> OTelTracer:
        """OTLP/HTTP (protobuf) to `config.endpoint`, in batches."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=config.endpoint, timeout=EXPORT_TIMEOUT_S)
        # The SDK's batching (512 spans per export; OTEL_BSP_* apply): 64 per export measured worse at 50 streams.
        return cls.to(BatchSpanProcessor(exporter), config.sampler_ratio, config.service_name, config.capture_text,
                      config.follow_caller_sampling)

    @classmethod
    def to(cls, sink: SpanExporter | SpanProcessor, ratio: float = 1.0, service_name: str = "cascade",
           capture_text: bool = False, follow_caller: bool = True) -> OTelTracer:
        """Spans to `sink`: a processor as it is, an exporter span by span (tests' in-memory one)."""
        processor = sink if isinstance(sink, SpanProcessor) else SimpleSpanProcessor(sink)
        return cls(processor, ratio, service_name, capture_text, follow_caller)

    def sampling(self, trace_id: int) -> TraceFlags:
        """The gateway's own decision for a trace: the SDK's ratio rule on its id (so gateways agree on a trace)."""
        return _SAMPLED if trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < self.bound else _UNSAMPLED

    def draw(self) -> TraceFlags:
        """The gateway's own decision for a caller's trace when it does not follow the caller: a random draw at the
        ratio. Not the ratio rule on the trace id, which the caller chooses (ids whose low 64 bits are small were all
        traced at any ratio)."""
        return _SAMPLED if random.getrandbits(64) < self.bound else _UNSAMPLED

    def shutdown(self) -> None:
        """Export what is left and stop (blocks up to the exporter's timeout: call it off the event loop)."""
        self.processor.shutdown()

    def start(self, name: str, kind: SpanKind = SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None,
              parent: RecordingSpan | SpanContext | None = None) -> RecordingSpan:
        """A span started now, under `parent` (default: the current span, or a new trace)."""
        return RecordingSpan(self, name, kind, parent if parent is not None else _current.get(), attributes)

    # --- INTERNAL spans ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[RecordingSpan]:
        span = self.start(name, attributes=attributes)
        token = _current.set(span)
        try:
            yield span
        except BaseException as exc:
            failed(span, exc)
            raise
        finally:
            _current.reset(token)
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
        method, path = scope["method"], scope["path"]
        attributes: dict[str, Any] = {"http.request.method": method, "http.route": path, "url.path": path,
                                      "url.scheme": scope.get("scheme", "http")}
        if server := scope.get("server"):
            attributes["server.address"], attributes["server.port"] = server[0], server[1] or 0
        if client := scope.get("client"):
            attributes["client.address"] = client[0]
        span = RecordingSpan(self, f"{method} {path}", SpanKind.SERVER, self.caller(scope["headers"]), attributes)
        traceparent = span.traceparent().encode()
        token = _current.set(span)

        async def send_traced(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                span.set_attribute("http.response.status_code", status)
                for name, value in message.get("headers", ()):
                    if name == b"x-cascade-tier":
                        span.set_attribute("cascade.tier", value.decode("latin-1"))
                if status >= 500:
                    span.set_attribute("error.type", str(status))
                    span.set_status(_ERROR)
                message = {**message, "headers": [*message.get("headers", ()), (b"traceparent", traceparent)]}
            await send(message)

        try:
            await app(scope, receive, send_traced)
        except BaseException as exc:
            failed(span, exc)
            raise
        finally:
            _current.reset(token)
            span.end()

    def caller(self, headers: list[tuple[bytes, bytes]]) -> SpanContext | None:
        """The caller's span, from a well-formed `traceparent` (and `tracestate`); None: a new trace."""
        carrier = incoming(headers)
        if not carrier:
            return None
        parent = get_current_span(self.propagator.extract(carrier)).get_span_context()
        return parent if parent.is_valid else None


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


def failed(span: RecordingSpan, exc: BaseException) -> None:
    """Mark `span` failed by `exc`'s type (a cancellation or a consumer closing early is no failure)."""
    kind = error_type(exc)
    if kind is not None:
        span.set_attribute("error.type", kind)
        span.set_status(_ERROR)


class _BranchSpans(BranchSpans):
    """One "cascade.branch" span per launched branch, under the run's span."""

    def __init__(self, tracer: OTelTracer, run: RecordingSpan) -> None:
        self.tracer = tracer
        self.run = run
        self.spans: dict[int, RecordingSpan] = {}

    def context(self, index: int) -> contextvars.Context:
        span = self.tracer.start("cascade.branch", attributes={"cascade.branch.index": index}, parent=self.run)
        self.spans[index] = span
        context = contextvars.copy_context()
        context.run(_current.set, span)  # current in that context only
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
