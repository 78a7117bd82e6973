"""Tracing's CPU per request on the gateway's event loop: cascade's spans (cascade/tracing/otel.py RecordingSpan)
against the OpenTelemetry SDK's own spans for the same span tree, in one process, side by side.

Method
  * One request's tracing work, as the gateway does it: a SERVER span around an ASGI call (`OTelTracer.serve`, its
    traceparent answered), the routing decision's INTERNAL span with its attributes (cascade/service/spans.py's
    keys), one CLIENT span per upstream call with GenAI attributes and an injected traceparent, its usage at the end.
    `--calls` upstream calls per request (1: a plain request; 8: a branched one).
  * `sdk`: the same tree through the SDK's TracerProvider (ParentBased ratio sampler, BoundedAttributes, its
    propagator): what the gateway paid before RecordingSpan. `off`: the same ASGI call with no tracing.
  * Spans go to a BatchSpanProcessor over an exporter that encodes each batch to OTLP protobuf and drops it (`encode`,
    the exporter's CPU without a network), or over one that drops it unencoded (`null`: the loop's share alone).
  * Rounds alternate the variants; CPU seconds of the process (`time.process_time`, the export thread included) per
    request, the median of `--rounds`; `loop_us` is the null exporter's (what the event loop pays per request).
Output: one JSON object on stdout.
Usage: .venv/bin/python -m benchmarks.frontdoor.tracing_cost [--requests 3000] [--rounds 5] [--calls 1]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Coroutine, Sequence
from types import SimpleNamespace
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from cascade import tracing
from cascade.testing.scripts import print_result
from cascade.tracing.otel import OTelTracer

SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "scheme": "http",
         "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000), "headers": [(b"content-type", b"json")]}
ROUTE = {"cascade.tier": "qwen2.5-coder-0.5b", "cascade.tier.index": 1, "cascade.routing.policy": "learned",
         "cascade.routing.mode": "route", "cascade.quality": "balanced", "cascade.load.in_flight": 3,
         "cascade.load.tier_in_flight": 1, "cascade.load.degraded": False, "cascade.difficulty": 0.42,
         "cascade.route_score": 0.31, "cascade.out_of_domain": False, "cascade.p_fail": [0.6, 0.3, 0.2, 0.1]}
REQUEST = SimpleNamespace(messages=[], max_tokens=512, temperature=0.7, top_p=None, seed=None)
DELTA = SimpleNamespace(text="t", finish_reason="stop", prompt_tokens=42, completion_tokens=512, chunks=1)


class Dropping(SpanExporter):
    def __init__(self, encode: bool) -> None:
        self.encode, self.spans = encode, 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        if self.encode:
            encode_spans(spans).SerializePartialToString()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(message: dict[str, Any]) -> None:
    pass


async def _respond(send: Callable[[dict[str, Any]], Coroutine[Any, Any, None]]) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-cascade-tier", b"t")]})
    await send({"type": "http.response.body", "body": b"{}", "more_body": False})


def cascade_request(tracer: OTelTracer, calls: int) -> Callable[[], Coroutine[Any, Any, None]]:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        with tracing.span("cascade.route") as span:
            assert span is not None
            span.set_attributes(ROUTE)
        for i in range(calls):
            call = tracer.upstream("openai", "m", "127.0.0.1", 9000, f"t/{i}", REQUEST, {"content-type": "json"})
            call.saw(DELTA)
            call.end()
        await _respond(send)

    return lambda: tracer.serve(app, SCOPE, _receive, _send)


def sdk_request(provider: TracerProvider, calls: int) -> Callable[[], Coroutine[Any, Any, None]]:
    """The same tree through the SDK's own spans (the gateway's tracing before RecordingSpan)."""
    tracer, propagator = provider.get_tracer("cascade"), TraceContextTextMapPropagator()
    from opentelemetry import context

    async def request() -> None:
        server = tracer.start_span("POST /v1/chat/completions", kind=SpanKind.SERVER, attributes={
            "http.request.method": "POST", "http.route": SCOPE["path"], "url.path": SCOPE["path"],
            "url.scheme": "http", "server.address": "127.0.0.1", "server.port": 8000, "client.address": "127.0.0.1"})
        token = context.attach(set_span_in_context(server))
        route = tracer.start_span("cascade.route")
        route_token = context.attach(set_span_in_context(route))
        route.set_attributes(ROUTE)
        context.detach(route_token)
        route.end()
        for i in range(calls):
            span = tracer.start_span("chat m", kind=SpanKind.CLIENT, attributes={
                "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "m",
                "gen_ai.request.max_tokens": 512, "server.address": "127.0.0.1", "server.port": 9000,
                "cascade.backend": f"t/{i}", "gen_ai.request.temperature": 0.7})
            carrier = {"content-type": "json"}
            propagator.inject(carrier, context=set_span_in_context(span))
            span.set_attributes({"gen_ai.usage.output_tokens": 512, "gen_ai.usage.input_tokens": 42,
                                 "gen_ai.response.finish_reasons": ["stop"]})
            span.end()
        server.set_attribute("http.response.status_code", 200)
        server.set_attribute("cascade.tier", "t")
        await _respond(_send)
        context.detach(token)
        server.end()

    return request


def off_request() -> Callable[[], Coroutine[Any, Any, None]]:
    async def request() -> None:
        with tracing.span("cascade.route"):
            pass
        await _respond(_send)

    return request


async def cpu_per_request(variant: str, exporter: Dropping, requests: int, calls: int) -> float:
    """CPU seconds per request of `requests` (after 100 unmeasured), the export of every span included."""
    processor = BatchSpanProcessor(exporter, max_queue_size=max(2048, requests * (2 + calls)))
    if variant == "cascade":
        tracer = OTelTracer.to(processor)
        tracing.install(tracer)
        run, stop = cascade_request(tracer, calls), tracer.shutdown
    elif variant == "sdk":
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(1.0)),
                                  resource=Resource.create({"service.name": "cascade"}))
        provider.add_span_processor(processor)
        run, stop = sdk_request(provider, calls), provider.shutdown
    else:
        run, stop = off_request(), processor.shutdown
    try:
        for _ in range(100):  # warm
            await run()
        started = time.process_time()
        for _ in range(requests):
            await run()
        stop()  # the export thread's share: every queued span encoded before the clock stops
        return (time.process_time() - started) / requests
    finally:
        tracing.install(None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=1, help="upstream calls (CLIENT spans) per request")
    p.add_argument("--json-out", help="also write the JSON here")
    args = p.parse_args()
    variants = ("off", "sdk", "cascade")
    samples: dict[str, dict[str, list[float]]] = {e: {v: [] for v in variants} for e in ("null", "encode")}
    exported = dict.fromkeys(variants, 0)  # spans the exporter got in the last round: every span made is exported
    for r in range(args.rounds):
        for exporting in ("null", "encode"):
            for variant in variants if r % 2 == 0 else variants[::-1]:
                exporter = Dropping(encode=exporting == "encode")
                seconds = asyncio.run(cpu_per_request(variant, exporter, args.requests, args.calls))
                samples[exporting][variant].append(seconds * 1e6)
                exported[variant] = exporter.spans
    us = {e: {v: round(statistics.median(s), 1) for v, s in by.items()} for e, by in samples.items()}
    added = {e: {v: round(us[e][v] - us[e]["off"], 1) for v in ("sdk", "cascade")} for e in us}
    print_result({
        "config": {k: v for k, v in vars(args).items() if k != "json_out"},
        "cpu_us_per_request": us, "added_us_per_request": added,
        "loop_us": added["null"], "spans_exported": exported, "cascade_vs_sdk_added": {
            e: round(added[e]["cascade"] / added[e]["sdk"], 3) for e in added},
        "samples_us": {e: {v: [round(x, 1) for x in s] for v, s in by.items()} for e, by in samples.items()},
    }, args.json_out, indent=1)


if __name__ == "__main__":
    main()
