"""`GET /ready` from local state: whether this gateway can serve, answered without calling any engine.

Engines are probed in the background (cascade/branches/health_poller.py, one poller per engine URL, started and
stopped with the gateway), and each tier's replica pool reads its replicas' verdicts (cascade/branches/pool.py). A
tier serves while some replica is neither benched by its circuit breaker nor seen down by its health checks. The
gateway is ready while some tier serves: a stalled engine fails (or falls back from) only its own tier's requests,
so the whole gateway must not leave its load balancer's rotation for it, as it did when /ready probed every engine
live (1-20 s for SGLang, against Envoy's 1 s timeout) and failed on any tier. The HTTP status is the route's
(cascade/gateway/app.py): 200 while some tier serves ("ready", or "degraded" with the others named under
`unhealthy`), 503 when none does ("unavailable") and while draining (cascade/gateway/chat_asgi.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cascade.branches.health_poller import HealthMonitor
from cascade.config import HealthConfig
from cascade.engines.supervisor import Worker
from cascade.tiers.build import Tier


class Readiness:
    """The tiers' engine health, polled while the gateway runs, and the /ready report built from it."""

    def __init__(self, tiers: Sequence[Tier], workers: Mapping[str, Worker], config: HealthConfig) -> None:
        self.tiers = list(tiers)
        self.workers = workers
        self.monitor = HealthMonitor(config)
        if config.enabled:
            for tier in self.tiers:
                tier.backend.watch_health([self.monitor.watch(b) for b in tier.backend.backends])

    async def start(self) -> None:
        await self.monitor.start()

    async def aclose(self) -> None:
        await self.monitor.aclose()

    def report(self) -> dict[str, Any]:
        """Per tier whether it serves, per replica its breaker and health, the tiers and replicas that cannot serve
        now (`unhealthy`), and the embedded workers' state."""
        tiers = {t.name: t.backend.serving() for t in self.tiers}
        replicas: dict[str, dict[str, dict[str, Any]]] = {}
        down: list[str] = []
        for tier in self.tiers:
            states = tier.backend.states()
            replicas[tier.name] = {r.name: {"breaker": r.state, "outstanding": r.outstanding,
                                            "consecutive_failures": r.consecutive_failures,
                                            "next_probe_s": r.next_probe_s, "health": r.health,
                                            "health_error": r.health_error}
                                   for r in states}
            down.extend(r.name for r in states if r.state == "open" or r.health == "down")
        workers = {name: {"url": w.url, "pid": w.process.pid if w.process else None, "alive": w.alive(),
                          "restarts": w.restarts}
                   for name, w in self.workers.items()}
        unhealthy = {"tiers": [name for name, ok in tiers.items() if not ok], "replicas": down}
        return {"tiers": tiers, "unhealthy": unhealthy, "replicas": replicas, "workers": workers}
