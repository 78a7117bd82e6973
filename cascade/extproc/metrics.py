"""The model picker's Prometheus series (`cascade_extproc_*`, a registry of their own: tests run several pickers in
one process) and the plain HTTP listener that serves them (`/metrics`) and a liveness answer (`/health`).

    metrics = ExtprocMetrics(["small", "medium", "large"], shared=gateway_metrics.registry)
    metrics.decided("small", key="team-a"); metrics.refused(429); metrics.observe(seconds)   # pre-bound children
    listener = MetricsListener(metrics, "127.0.0.1", 9003).start()   # a daemon thread; .stop() at exit
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Sequence
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import MetricsHandler
from prometheus_client.metrics_core import Metric

from cascade.errors import ConfigError

# Seconds: the decision is ~0.2 ms in process (docs/scaling.md); a shared Redis limit adds a round trip.
_DECISION_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1)
# The statuses the picker answers with (the gateway's refusals, the proxy buffer's 413, a bug's 500): bound up front.
_STATUSES = (400, 401, 403, 404, 405, 413, 429, 500, 503)


# The series of the gateway's own registry that the picker moves too (its keys' refusals, the shared limits' Redis
# store): the rest of that registry (requests served, tokens, branches) belongs to `cascade serve` and stays at 0 here.
SHARED_PREFIXES = ("cascade_key_rate_limited", "cascade_redis_")


class _SharedSeries:
    """A collector that re-exports the families of `registry` whose names start with SHARED_PREFIXES."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        return (m for m in self.registry.collect() if m.name.startswith(SHARED_PREFIXES))


class ExtprocMetrics:
    def __init__(self, tiers: Sequence[str], shared: CollectorRegistry | None = None) -> None:
        self.registry = r = CollectorRegistry()
        self.decisions = Counter("cascade_extproc_decisions", "Chat completions sent on, by the tier picked",
                                 ["tier"], registry=r)
        self.refusals = Counter("cascade_extproc_refusals", "Chat completions answered at once with an error, by "
                                "HTTP status", ["status"], registry=r)
        self.decision_latency = Histogram(
            "cascade_extproc_decision_seconds", "The picker's work per chat completion (checks, route, rewrite), "
            "refusals included", buckets=_DECISION_BUCKETS, registry=r)
        self.to_gateway = Counter("cascade_extproc_gateway_requests", "Chat completions sent on to the gateway "
                                  "(reasoning branches) instead of the tier's engines", registry=r)
        self.streams = Gauge("cascade_extproc_open_streams", "ext_proc gRPC streams open now (one per HTTP request "
                             "Envoy is processing)", registry=r)
        # `key` is a configured key's name (`[[gateway.keys]]`), so the labels are bounded by the config.
        self.key_decisions = Counter("cascade_extproc_key_decisions", "Chat completions of an API key sent on to a "
                                     "tier's engines (the gateway counts those it serves)", ["key", "tier"], registry=r)
        if shared is not None:
            r.register(_SharedSeries(shared))
        # Children bound once: the decision path only increments.
        self._decided = {tier: self.decisions.labels(tier) for tier in tiers}
        self._refused = {status: self.refusals.labels(str(status)) for status in _STATUSES}

    def observe(self, seconds: float) -> None:
        """The picker's time on one chat completion."""
        self.decision_latency.observe(seconds)

    def decided(self, tier: str, *, via_gateway: bool = False, key: str | None = None) -> None:
        self._decided[tier].inc()
        if via_gateway:
            self.to_gateway.inc()
        elif key is not None:
            self.key_decisions.labels(key, tier).inc()

    def refused(self, status: int) -> None:
        child = self._refused.get(status)
        if child is None:  # a status outside the usual set: bound on first use (still a handful of values)
            child = self._refused[status] = self.refusals.labels(str(status))
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


# A scrape connection may be idle this long before it is closed, and this many are served at once: one that opens
# connections and sends nothing holds neither a thread nor the port for long (each had a thread for good).
IDLE_S = 5.0
MAX_CONNECTIONS = 16


class _Handler(MetricsHandler):
    timeout = IDLE_S  # the socket's: a request not sent within it ends the connection

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        if path == "/metrics":
            super().do_GET()
        elif path == "/health":
            self._plain(200, b"ok\n")
        else:
            self._plain(404, b"not found: /metrics and /health only\n")

    def _plain(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_port = False  # never share a port (the gRPC server's, another picker's)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection up to MAX_CONNECTIONS; past them the connection is closed at once."""
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Server6(_Server):
    address_family = socket.AF_INET6


class MetricsListener:
    """`/metrics` (the registry, in Prometheus' text format) and `/health` (200 while the process serves) on
    host:port, from a daemon thread: a scrape never waits on the event loop, nor the loop on a scrape."""

    def __init__(self, metrics: ExtprocMetrics, host: str, port: int) -> None:
        self.metrics, self.host, self.port = metrics, host, port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsListener:
        server_class = _Server6 if ":" in self.host else _Server
        try:
            self._server = server_class((self.host, self.port),
                                        type("_Handler", (_Handler,), {"registry": self.metrics.registry}))
        except OSError as exc:
            raise ConfigError(f"--metrics-port {self.port}: cannot listen on {self.host}: {exc.strerror}") from None
        self.port = self._server.server_address[1]  # the one bound, for port 0 in tests
        self._thread = threading.Thread(target=self._server.serve_forever, name="cascade-extproc-metrics",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
