"""Worker start-up ends with one real generation over HTTP: an engine that is healthy but cannot
generate (e.g. transformers refusing a KV-cache plan larger than free memory) fails start-up with
its reason, instead of failing the first user request."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from cascade.config import WorkerConfig
from cascade.engines.supervisor import Supervisor, Worker, worker_command, worker_env
from cascade.errors import ConfigError
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from tests.branches.test_sglang_health import SlowHealth

# A stand-in process for the engine: the HTTP side is the in-process fake engine on `port`.
IDLE = [sys.executable, "-c", "import time; time.sleep(60)"]


def start_worker(url: str, tmp_path: Path) -> None:
    port = int(url.rsplit(":", 1)[1])
    worker = Worker(WorkerConfig(name="w", model="m", port=port, startup_timeout_s=20), tmp_path, tmp_path,
                    command=IDLE, first_generation=True)
    supervisor = Supervisor([worker])

    async def run() -> None:
        await supervisor.start()
        supervisor.stop()

    asyncio.run(run())


def test_a_healthy_engine_that_cannot_generate_fails_start_up_with_its_reason(tmp_path) -> None:
    engine = FakeEngine(FakeScript(status=500))
    with serve_asgi(engine) as url:
        with pytest.raises(ConfigError, match=r"failed its first generation \(HTTP 500\)"):
            start_worker(url, tmp_path)
        assert engine.stats.requests == 1


def test_an_engine_that_generates_starts(tmp_path) -> None:
    engine = FakeEngine(FakeScript(tokens=1))
    with serve_asgi(engine) as url:
        start_worker(url, tmp_path)
        assert engine.stats.requests == 1


def test_transformers_workers_get_a_bounded_cache_and_batch() -> None:
    command = worker_command(Path("/models/x"), 1234, WorkerConfig(name="w", model="m"))
    assert command[command.index("--cb-num-blocks") + 1] == "128"
    assert command[command.index("--cb-max-batch-tokens") + 1] == "1024"


def test_engine_threads_sleep_when_idle_unless_the_operator_says_otherwise(monkeypatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert worker_env()["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert worker_env()["OMP_WAIT_POLICY"] == "ACTIVE"


def test_a_start_up_health_probe_waits_as_long_as_its_workers_probe_may_take(tmp_path) -> None:
    """An SGLang engine's /health runs a one-token generation (1-20 s): `cascade deploy` gives its probes
    `Timeouts.health_s`; a probe cut short of the answer would never see the engine healthy."""
    with serve_asgi(SlowHealth(delay_s=0.6)) as url:
        port = int(url.rsplit(":", 1)[1])
        patient = Worker(WorkerConfig(name="w", model="m", port=port, startup_timeout_s=10), tmp_path,
                         tmp_path, command=IDLE, first_generation=False, health_timeout_s=2.0)
        hasty = Worker(WorkerConfig(name="h", model="m", port=port, startup_timeout_s=1.5), tmp_path,
                       tmp_path, command=IDLE, first_generation=False, health_timeout_s=0.3)

        async def start(worker: Worker) -> None:
            supervisor = Supervisor([worker])
            try:
                await supervisor.start()
            finally:
                supervisor.stop()

        asyncio.run(start(patient))
        with pytest.raises(ConfigError, match=r"not healthy after 1\.5 s"):
            asyncio.run(start(hasty))
