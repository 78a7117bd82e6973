"""Assemble a running gateway from a config: workers, backends, service, app, uvicorn."""

from __future__ import annotations

import asyncio
import logging
import math
import os
from pathlib import Path
from typing import Any

from cascade import tracing
from cascade.config import CascadeConfig, GatewayConfig, load_config
from cascade.engines.sglang_launch import is_loopback
from cascade.errors import ConfigError
from cascade.gateway.app import create_app
from cascade.gateway.chat_asgi import ChatCompletionsASGI
from cascade.gateway.drain import longest_drain_s
from cascade.gateway.monitoring import MonitoringApp, MonitoringListener
from cascade.plan import load_plan
from cascade.service.assemble import assemble
from cascade.service.chat import ServiceConfig
from cascade.service.keys.keyring import MIN_KEY_CHARS, MIN_KEY_DISTINCT, weak_plain_keys
from cascade.service.readiness import Readiness
from cascade.tiers.lifecycle import TierFleet

log = logging.getLogger("cascade.gateway")


class Gateway:
    """Everything `cascade serve` runs, owned in one place so that shutdown is complete."""

    def __init__(self, config: CascadeConfig, plan_path: str | None = None, log_dir: Path | None = None,
                 host: str = "127.0.0.1", port: int | None = None) -> None:
        """`host`: where the monitoring port binds (`[gateway] monitoring_port`), as the gateway's own port; `port`:
        the gateway's, said in the log once it is ready (None: not said)."""
        self.config = config
        self.address = None if port is None else f"http://{host}:{port}"
        # Built now (the service needs its tiers), started by `start` and closed by `stop` (cascade/tiers/lifecycle.py).
        self.fleet = TierFleet(config, log_dir=log_dir)
        self.workers, tiers = self.fleet.workers, self.fleet.tiers
        parts = assemble(config, tiers, ServiceConfig.of(config, load_plan(plan_path) if plan_path else None),
                         serves=True)
        self.service, self.metrics, self.redis, self.places = parts.service, parts.metrics, parts.redis, parts.places
        assert parts.engines is not None  # a serving gateway's
        self.engines = parts.engines
        gateway = config.gateway
        self.metrics.watch_pools(lambda: [t.backend for t in self.service.tiers])
        # Engine health, probed in the background while the gateway runs: /ready and replica picking read it.
        self.readiness = Readiness(tiers, self.workers, config.gateway.health)
        self.app = create_app(self.service, ready_check=self.ready, on_startup=[self.start], on_shutdown=[self.stop],
                              monitoring_port=gateway.monitoring_port,
                              client_metrics=client_port_metrics(gateway, host), responses=parts.responses)
        # /metrics and /ready's detail on a port of their own when one is set (cascade/gateway/monitoring.py).
        self.monitoring = MonitoringListener(
            MonitoringApp(self.metrics.render, self.ready, lambda: self.app.drain.draining),
            host, gateway.monitoring_port, gateway.limits) if gateway.monitoring_port else None
        # Traces over OTLP/HTTP when an endpoint is set (cascade/tracing/; the `otel` extra): this process's tracer.
        self.tracer = tracing.configure(gateway.tracing) if gateway.tracing.endpoint else None
        self.app.drain.grace_s = config.gateway.shutdown_grace_s
        self.app.drain.linger_s = config.gateway.shutdown_linger_s

    async def start(self) -> None:
        if self.monitoring is not None:
            await self.monitoring.start()
        try:
            await self._start()
        except BaseException:
            if self.monitoring is not None:  # a failed start never leaves the port open
                await self.monitoring.aclose()
            raise

    async def _start(self) -> None:
        if self.redis is not None:
            await self.redis.start()
        await self.engines.start()
        if self.workers:
            log.info("starting %d embedded workers (first start loads the models; ~1 min on 2 cores)",
                     len(self.workers))
        await self.fleet.start()
        # After the workers: they are healthy by now, and probes during their start would only mark them down.
        await self.readiness.start()
        log.info("tiers: %s", ", ".join(t.name for t in self.service.tiers))
        if self.address is not None:  # uvicorn's own line is off (log_level warning): say where to send requests
            log.info("ready: listening on %s (OpenAI API at %s/v1; Ctrl-C drains and stops)", self.address,
                     self.address)

    async def stop(self) -> None:
        """After the drain (cascade/gateway/drain.py): no request is in flight any more."""
        try:
            await self.readiness.aclose()  # first: a probe after its backend closed would reopen its session
            if self.places is not None:
                await self.places.aclose()
            if self.redis is not None:
                await self.redis.aclose()
            await self.engines.aclose()
            self.service.close()
            if self.service.telemetry.traffic is not None:
                self.service.telemetry.traffic.close()
            if self.tracer is not None:  # the last spans exported (up to the exporter's timeout), off the loop
                if tracing.active is self.tracer:
                    tracing.install(None)
                await asyncio.to_thread(self.tracer.shutdown)
        finally:
            try:
                await self.fleet.aclose()  # every backend and scorer closed, the embedded workers stopped
            finally:
                if self.monitoring is not None:  # last: a draining gateway can be scraped until here
                    await self.monitoring.aclose()
        log.info("stopped")

    async def ready(self) -> dict[str, Any]:
        """Which tiers can serve, from local state only (cascade/service/readiness.py): no engine is called."""
        return self.readiness.report()


def run(
    config: CascadeConfig, plan_path: str | None, host: str, port: int, log_level: str = "info",
    processes: int = 1, config_path: str | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM, then drain (cascade/gateway/drain.py). `processes` > 1 runs that many
    gateway processes on one socket (uvicorn workers), for when one event loop is the bottleneck; each
    process has its own admission counter (shared with `[gateway.redis] url`), connection limit and /metrics, and
    embedded workers need the single-process mode. Connection limits: cascade/gateway/connections.py."""
    import uvicorn

    from cascade.gateway.connections import GatewayProtocol, raise_open_files_limit

    _configure_logging(log_level)
    if not is_loopback(host) and (weak := weak_plain_keys(config.gateway.api_keys)):
        raise ConfigError(f"{', '.join(weak)} in [gateway] api_keys: too easy to guess for a gateway on {host} "
                          f"(under {MIN_KEY_CHARS} characters or {MIN_KEY_DISTINCT} distinct ones): make keys with "
                          "`cascade keys add`, or bind 127.0.0.1")
    if warning := exposure_warning(host, (*config.gateway.api_keys, *(k.name for k in config.gateway.keys))):
        log.warning(warning)
    before, after = raise_open_files_limit()  # inherited by --processes children
    if after != before:
        log.info("open files limit raised from %d to %d", before, after)
    # The drain ends what is left when its grace runs out; uvicorn's own timeout is only a backstop.
    grace = math.ceil(longest_drain_s(config.gateway.shutdown_grace_s, config.gateway.shutdown_linger_s)) + 5
    options: dict[str, Any] = dict(host=host, port=port, log_level="warning", access_log=False, http=GatewayProtocol,
                                   ws="none", timeout_graceful_shutdown=grace, backlog=4096)
    monitoring_port = config.gateway.monitoring_port
    if monitoring_port and monitoring_port == port:
        raise ConfigError(f"[gateway] monitoring_port {monitoring_port} is the gateway's port: give it another (or 0, "
                          "off)")
    if processes > 1:
        if monitoring_port:
            raise ConfigError("[gateway] monitoring_port needs --processes 1 (the processes would each need a port "
                              "of their own, and each holds its own metrics)")
        if config.workers or config_path is None:
            raise ConfigError("--processes > 1 needs a --config without [[workers]] (embedded workers are started "
                              "by a single gateway process)")
        os.environ[_CONFIG_ENV], os.environ[_PLAN_ENV], os.environ[_HOST_ENV] = config_path, plan_path or "", host
        log.info("%d gateway processes listening on http://%s:%d", processes, host, port)
        uvicorn.run("cascade.gateway.server:app_from_env", factory=True, workers=processes, **options)
        return
    gateway = Gateway(config, plan_path, host=host, port=port)
    if gateway.monitoring is not None:
        gateway.monitoring.bind()  # now: a port in use is a config error before anything starts
    try:
        uvicorn.run(gateway.app, **options)
    finally:
        # uvicorn runs on_shutdown on SIGINT/SIGTERM; this also covers a failed startup.
        gateway.fleet.supervisor.stop()


def exposure_warning(host: str, api_keys: tuple[str, ...]) -> str | None:
    """One line when the gateway listens beyond loopback without API keys, else None."""
    if api_keys or is_loopback(host):
        return None
    return (f"the gateway listens on {host}, reachable from the network, without API keys: set [gateway] api_keys "
            "(or [[gateway.keys]], `cascade keys add`) to require a bearer token, or bind 127.0.0.1")


def client_port_metrics(gateway: GatewayConfig, host: str) -> bool:
    """Whether the clients' port serves /metrics (`[gateway] metrics_on_client_port`): never beside a monitoring
    port; as set; unset, unless it would publish each key's requests, tokens and spend to the network."""
    if gateway.monitoring_port:
        return False
    if gateway.metrics_on_client_port is not None:
        return gateway.metrics_on_client_port
    return not gateway.keys or is_loopback(host)


_CONFIG_ENV, _PLAN_ENV, _HOST_ENV = "CASCADE_GATEWAY_CONFIG", "CASCADE_GATEWAY_PLAN", "CASCADE_GATEWAY_HOST"


def app_from_env() -> ChatCompletionsASGI:
    """The app of one gateway process in multi-process mode (config path from the parent's environment)."""
    _configure_logging("warning")
    return Gateway(load_config(os.environ[_CONFIG_ENV]), os.environ.get(_PLAN_ENV) or None,
                   host=os.environ.get(_HOST_ENV, "127.0.0.1")).app


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream request is noise
