"""A real OTLP/HTTP trace receiver on 127.0.0.1, for tests and benchmarks: it accepts `POST /v1/traces`
(protobuf, optionally gzip), decodes each ExportTraceServiceRequest with opentelemetry-proto (what the exporter of the
`otel` extra depends on) and keeps the spans, flattened into `ReceivedSpan`s.

`python -m cascade.testing.otlp --port P` runs one as a sink (benchmarks/frontdoor/gateway_overhead.py): it decodes and
counts, keeps nothing, and prints the count when it gets SIGTERM.
"""

from __future__ import annotations

import argparse
import gzip
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

MAX_BODY_BYTES = 64 << 20
KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass
class ReceivedSpan:
    service: str  # the resource's service.name
    name: str
    kind: str  # SERVER, CLIENT, INTERNAL, ...
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def value(v: Any) -> Any:
    """An OTLP AnyValue as Python."""
    which = v.WhichOneof("value")
    if which == "array_value":
        return [value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    return None if which is None else getattr(v, which)


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(ReceivedSpan(
                    service=str(resource.get("service.name", "")), name=s.name, kind=KINDS.get(s.kind, str(s.kind)),
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), parent_span_id=s.parent_span_id.hex(),
                    attributes={kv.key: value(kv.value) for kv in s.attributes},
                    events=[(e.name, {kv.key: value(kv.value) for kv in e.attributes}) for e in s.events]))
    return spans


class Receiver:
    """The spans received so far (`spans`, or only their count when `keep` is False), and the requests."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.spans: list[ReceivedSpan] = []
        self.received = 0  # spans
        self.requests = 0
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if self.path != "/v1/traces" or not 0 < length <= MAX_BODY_BYTES:
                    self.send_error(404 if self.path != "/v1/traces" else 400)
                    return
                body = self.rfile.read(length)
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                spans = decode(body)
                with receiver.lock:
                    receiver.requests += 1
                    receiver.received += len(spans)
                    if receiver.keep:
                        receiver.spans.extend(spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def do_GET(self) -> None:  # health: 200 on /
                self.send_response(200 if self.path == "/" else 404)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        return Handler


@contextmanager
def otlp_receiver(port: int = 0, keep: bool = True) -> Iterator[tuple[str, Receiver]]:
    """A receiver on 127.0.0.1 (`port` 0: a free one) in a thread, stopped when the block exits; yields its
    /v1/traces URL and the receiver."""
    receiver = Receiver(keep)
    server = ThreadingHTTPServer(("127.0.0.1", port), receiver.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description="an OTLP/HTTP trace sink on 127.0.0.1 (counts spans)")
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with otlp_receiver(port, keep=False) as (_, receiver):
        print(f"listening on 127.0.0.1:{port}", flush=True)
        stop.wait()
    print(f"spans received: {receiver.received} in {receiver.requests} requests", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
