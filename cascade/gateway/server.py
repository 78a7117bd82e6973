"""Assemble a running gateway from a config: workers, backends, service, app, uvicorn."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import msgspec

from cascade.branches.backend import Backend
from cascade.branches.openai_client import OpenAIBackend
from cascade.branches.pool import ReplicaPool
from cascade.branches.sglang_client import SGLangBackend
from cascade.config import BackendConfig, CascadeConfig
from cascade.config import OpenAIBackend as OpenAIBackendConfig
from cascade.config import SGLangBackend as SGLangBackendConfig
from cascade.config import WorkerBackend as WorkerBackendConfig
from cascade.engines.supervisor import Supervisor, Worker
from cascade.gateway.app import create_app
from cascade.gateway.metrics import GatewayMetrics
from cascade.gateway.service import ChatService, Tier
from cascade.plan import load_plan
from cascade.router.policy import RoutingPolicy

log = logging.getLogger("cascade.gateway")


def make_backend(name: str, config: BackendConfig, workers: dict[str, Worker]) -> Backend:
    match config:
        case OpenAIBackendConfig():
            return OpenAIBackend(name, config.url, config.model, config.timeouts, config.api_key)
        case SGLangBackendConfig():
            return SGLangBackend(name, config.url, config.model, config.timeouts, config.api_key)
        case WorkerBackendConfig():
            worker = workers[config.worker]
            # transformers serve with a preloaded model answers any model id with that model.
            return OpenAIBackend(name, worker.url, str(worker.model_dir), config.timeouts)
    raise TypeError(f"unknown backend config {type(config).__name__}")


def make_workers(config: CascadeConfig, log_dir: Path) -> dict[str, Worker]:
    from cascade.engines.models import load_card, model_dir, prepare

    workers = {}
    for worker_config in config.workers:
        card = load_card(worker_config.model)
        directory = prepare(card) if not (model_dir(card) / "config.json").exists() else model_dir(card)
        workers[worker_config.name] = Worker(worker_config, directory, log_dir)
    return workers


class Gateway:
    """Everything `cascade serve` runs, owned in one place so that shutdown is complete."""

    def __init__(self, config: CascadeConfig, plan_path: str | None = None, log_dir: Path | None = None) -> None:
        self.config = config
        self.workers = make_workers(config, log_dir or Path.cwd() / "logs") if config.workers else {}
        self.supervisor = Supervisor(list(self.workers.values()))
        tiers = []
        for index, tier_config in enumerate(config.tiers):
            replicas = [make_backend(f"{tier_config.name}/{j}", b, self.workers)
                        for j, b in enumerate(tier_config.backends)]
            tiers.append(Tier(index=index, config=tier_config, backend=ReplicaPool(tier_config.name, replicas)))
        points = dict(config.routing.operating_points)
        if plan_path:
            points |= load_plan(plan_path).thresholds_by_hint(len(tiers))
        self.metrics = GatewayMetrics()
        self.service = ChatService(
            tiers, RoutingPolicy(len(tiers), points), config.gateway.limits, self.metrics,
            config.gateway.default_quality,
        )
        self.app = create_app(
            self.service, config.gateway.api_keys, ready_check=self.ready,
            on_startup=[self.start], on_shutdown=[self.stop],
        )

    async def start(self) -> None:
        if self.workers:
            log.info("starting %d embedded workers (first start loads the models; ~1 min on 2 cores)",
                     len(self.workers))
            await self.supervisor.start()
        log.info("tiers: %s", ", ".join(t.name for t in self.service.tiers))

    async def stop(self) -> None:
        for tier in self.service.tiers:
            await tier.backend.aclose()
        self.supervisor.stop()

    async def ready(self) -> dict[str, Any]:
        """Tier health (every tier needs one healthy replica) and the embedded workers' state."""
        results = await asyncio.gather(*(t.backend.health() for t in self.service.tiers))
        workers = {
            name: {"url": w.url, "pid": w.process.pid if w.process else None, "alive": w.alive(),
                   "restarts": w.restarts}
            for name, w in self.workers.items()
        }
        tiers = {t.name: bool(ok) for t, ok in zip(self.service.tiers, results, strict=True)}
        return {"tiers": tiers, "workers": workers}


def run(config: CascadeConfig, plan_path: str | None, host: str, port: int, log_level: str = "info") -> None:
    import uvicorn

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream request is noise
    gateway = Gateway(config, plan_path)
    try:
        uvicorn.run(gateway.app, host=host, port=port, log_level="warning", access_log=False,
                    timeout_graceful_shutdown=10, limit_concurrency=None, backlog=4096)
    finally:
        # uvicorn runs on_shutdown on SIGINT/SIGTERM; this also covers a failed startup.
        gateway.supervisor.stop()


__all__ = ["Gateway", "make_backend", "msgspec", "run"]
