"""The model picker's Prometheus series (`cascade_extproc_*`, a registry of their own: tests run several pickers in
one process) and the plain HTTP listener that serves them (`/metrics`) and a liveness answer (`/health`).

    metrics = ExtprocMetrics(["small", "medium", "large"], shared=gateway_metrics.registry)
    metrics.decided("small", key="team-a"); metrics.refused(429); metrics.observe(seconds)   # pre-bound children
    listener = MetricsListener(metrics, "127.0.0.1", 9003).start()   # one daemon thread; .stop() at exit
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from cascade.errors import ConfigError

# Seconds: the decision is ~0.2 ms in process (docs/scaling.md); a shared Redis limit adds a round trip.
_DECISION_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1)
# The statuses the picker answers with (the gateway's refusals, the proxy buffer's 413, a bug's 500): bound up front.
_STATUSES = (400, 401, 403, 404, 405, 413, 429, 500, 503)


# The series of the gateway's own registry that the picker moves too (its keys' refusals; their budgets, what it
# reserved of them and the downgrades past downgrade_at; the shared limits' Redis store): the rest of that registry
# (requests served, tokens, costs settled, branches) belongs to `cascade serve` and stays at 0 here.
SHARED_PREFIXES = ("cascade_key_rate_limited", "cascade_key_budget", "cascade_redis_")


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


# A scrape connection may be idle this long (between requests, or while sending one) before it is closed; this many
# are open at once, the rest closed on arrival; a request's line and headers fit in this many bytes.
IDLE_S = 5.0
MAX_CONNECTIONS = 64
MAX_HEAD_BYTES = 8192
_TEXT, _PROMETHEUS = b"text/plain; charset=utf-8", b"text/plain; version=0.0.4; charset=utf-8"
_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed"}


class MetricsListener:
    """`/metrics` (the registry, in Prometheus' text format) and `/health` (200 while the process serves) on
    host:port. One daemon thread runs an event loop of its own that serves every connection (an idle one costs a
    coroutine, not a thread): a scrape never waits on the picker's loop, nor the picker on a scrape."""

    def __init__(self, metrics: ExtprocMetrics, host: str, port: int) -> None:
        self.metrics, self.host, self.port = metrics, host, port
        self.open_connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsListener:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            sock = socket.create_server((self.host, self.port), family=family, backlog=128)
        except OSError as exc:
            raise ConfigError(f"--metrics-port {self.port}: cannot listen on {self.host}: {exc.strerror}") from None
        self.port = sock.getsockname()[1]  # the one bound, for port 0 in tests
        loop = self._loop = asyncio.new_event_loop()
        serving = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(loop, sock, serving), name="cascade-extproc-metrics",
                                        daemon=True)
        self._thread.start()
        serving.wait(10)
        return self

    def _run(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, serving: threading.Event) -> None:
        """The listener's thread: its own loop (start() may be called from a running one), until stop()."""
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(self._serve, sock=sock, limit=MAX_HEAD_BYTES))
        serving.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.run_until_complete(asyncio.sleep(0))  # the cancelled connections close their sockets
            loop.close()

    def stop(self) -> None:
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open_connections >= MAX_CONNECTIONS:
            writer.close()
            return
        self.open_connections += 1
        try:
            while await self._answer_one(reader, writer):
                pass
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # gone, idle, or a head too long: the connection ends
        finally:
            self.open_connections -= 1
            writer.close()

    async def _answer_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it; whether the connection stays open for another."""
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_S)
        line, _, fields = head.partition(b"\r\n")
        parts = line.split(b" ")
        lowered = fields.lower()
        headers = dict(f.partition(b":")[::2] for f in lowered.split(b"\r\n") if f)
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or b"transfer-encoding" in headers \
                or headers.get(b"content-length", b"0").strip() != b"0":  # no request here has a body
            await self._send(writer, b"GET", 400, b"bad request: GET /metrics or /health, without a body\n", _TEXT)
            return False
        method, path = parts[0], parts[1].partition(b"?")[0]
        if method not in (b"GET", b"HEAD"):
            await self._send(writer, method, 405, b"method not allowed: GET or HEAD\n", _TEXT, b"allow: GET, HEAD\r\n")
        elif path == b"/metrics":
            await self._send(writer, method, 200, generate_latest(self.metrics.registry), _PROMETHEUS)
        elif path == b"/health":
            await self._send(writer, method, 200, b"ok\n", _TEXT)
        else:
            await self._send(writer, method, 404, b"not found: /metrics and /health only\n", _TEXT)
        return parts[2] == b"HTTP/1.1" and headers.get(b"connection", b"").strip() != b"close"

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, method: bytes, status: int, body: bytes, kind: bytes,
                    extra: bytes = b"") -> None:
        writer.write(b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n"
                     % (status, _REASONS[status], kind, len(body), extra))
        if method != b"HEAD":
            writer.write(body)
        await asyncio.wait_for(writer.drain(), IDLE_S)
