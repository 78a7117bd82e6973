"""The monitoring port (`[gateway] monitoring_port`, `cascade serve --monitoring-port`): `/metrics` and `/ready` with
its detail on a listener of their own, as Envoy keeps its stats on its admin port and SGLang's model gateway its
metrics on `--prometheus-port`.

Why: the main port is the clients'. Whoever reaches it reads /ready's list of unhealthy tiers and replicas and
/metrics' figures per key and per tier; a port of its own can be kept internal (a network policy, a firewall). And a
scrape there never competes with clients for the main port's connections (`max_connections`).

With it on, the main port's /metrics is a 404 and its /ready answers `{"status": ...}` alone, with the same status
code (load balancers and Kubernetes probes keep checking it there). This port answers:

    GET /ready     the whole report (status, tiers, replicas, unhealthy); 503 when no tier can serve, or draining
    GET /metrics   Prometheus text
    anything else  404 (405 for a method other than GET or HEAD), OpenAI error objects

It is a uvicorn server of its own on the gateway's event loop, with the gateway's connection protocol and limits
(cascade/gateway/connections.py), bound on the gateway's host (`bind`, before anything starts, so that a port in use
is a config error) and served from the gateway's start to its stop: after the drain, so that a draining gateway can
still be scraped.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import msgspec

from cascade.config import Limits
from cascade.errors import ConfigError
from cascade.gateway.drain import LIMITS_KEY
from cascade.service.errors import error_response

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("cascade.gateway")
_encode = msgspec.json.Encoder().encode
ReadyCheck = Callable[[], Awaitable[dict[str, Any]]]
_JSON = b"application/json"
_PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"
_PATHS = ("/ready", "/metrics")


async def readiness(ready_check: ReadyCheck | None, draining: bool = False) -> tuple[int, dict[str, Any]]:
    """/ready's status code and report: `{"status": ..., **the check's report}`. 503 only when no tier can serve (a
    load balancer that saw one stalled tier take out every gateway would stop the healthy tiers too,
    cascade/service/readiness.py), or while draining."""
    try:
        report = await ready_check() if ready_check else {"tiers": {}}
    except Exception as exc:  # a probe that raises means "not ready", with the reason, never a 500
        log.exception("readiness check failed")
        report = {"tiers": {}, "error": f"readiness check failed: {type(exc).__name__}: {exc}"[:300]}
        status = "unavailable"
    else:
        tiers = report["tiers"]
        status = "ready" if all(tiers.values()) else "degraded" if any(tiers.values()) else "unavailable"
    if draining:
        status = "draining"
    return (503 if status in ("unavailable", "draining") else 200), {"status": status, **report}


class MonitoringApp:
    """The monitoring port's ASGI app: two GET routes, no framework."""

    def __init__(self, metrics: Callable[[], bytes], ready_check: ReadyCheck | None,
                 draining: Callable[[], bool] = lambda: False) -> None:
        self.metrics, self.ready_check, self.draining = metrics, ready_check, draining

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # served without lifespan or websockets
            return
        path, method = scope["path"], scope["method"]
        headers: list[tuple[bytes, bytes]] = []
        if path not in _PATHS:
            status, body, kind = 404, error_response(f"no route for {method} {path}", "invalid_request_error"), _JSON
        elif method not in ("GET", "HEAD"):
            status, kind = 405, _JSON
            body = error_response(f"method {method} is not allowed on {path}", "invalid_request_error")
            headers.append((b"allow", b"GET, HEAD"))
        elif path == "/metrics":
            status, body, kind = 200, self.metrics(), _PROMETHEUS
        else:
            status, report = await readiness(self.ready_check, self.draining())
            body, kind = _encode(report), _JSON
        headers += [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


class MonitoringListener:
    """The monitoring port's server, run on the gateway's event loop between its start and its stop."""

    def __init__(self, app: MonitoringApp, host: str, port: int, limits: Limits) -> None:
        self.app, self.host, self.port, self.limits = app, host, port, limits
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._ticks: asyncio.Task[None] | None = None

    def bind(self) -> None:
        """Take the port (once); a ConfigError when it is in use or the host has no such address."""
        if self._socket is not None:
            return
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            self._socket = socket.create_server((self.host, self.port), family=family, backlog=128)
        except OSError as exc:
            raise ConfigError(f"[gateway] monitoring_port {self.port} on {self.host}: "
                              f"{exc.strerror or exc}") from None

    async def start(self) -> None:
        import uvicorn
        from uvicorn.lifespan.off import LifespanOff

        from cascade.gateway.connections import GatewayProtocol

        self.bind()
        assert self._socket is not None
        # Not `Server.serve`: it would take over SIGINT/SIGTERM, which the gateway's own server handles (its drain
        # ends in the gateway's stop, which closes this one). The steps it runs between them, with no lifespan (the
        # gateway's app has its own) and the gateway's connection limits.
        config = uvicorn.Config(self.app, lifespan="off", log_config=None, access_log=False, http=GatewayProtocol,
                                ws="none", timeout_graceful_shutdown=2)
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = LifespanOff(config)
        server.lifespan.state[LIMITS_KEY] = self.limits
        await server.startup(sockets=[self._socket])
        self._server = server
        self._ticks = asyncio.get_running_loop().create_task(server.main_loop(), name="monitoring-port")
        log.info("monitoring on http://%s:%d (/metrics, /ready)", self.host, self.port)

    async def aclose(self) -> None:
        """Stop listening and close its connections (idle ones at once, a scrape in flight when answered)."""
        server, self._server = self._server, None
        if server is not None:
            server.should_exit = True
            if self._ticks is not None:
                await self._ticks
            await server.shutdown(sockets=[self._socket] if self._socket is not None else None)
        elif self._socket is not None:  # bound, never started
            self._socket.close()
        self._socket = None
