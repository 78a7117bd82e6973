"""Start, watch and stop engine workers: `transformers serve --continuous-batching` for the embedded
models, or any given command (`cascade deploy`: SGLang servers, fake engines).

Each worker is its own process group on a loopback port. The supervisor waits until every worker
answers /health, restarts a worker that dies (with backoff, up to `max_restarts`), and on shutdown
terminates each process group (SIGTERM, then SIGKILL after a grace period) so no orphan is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from cascade.config import WorkerConfig
from cascade.engines.worker_log import LogPump
from cascade.errors import ConfigError

log = logging.getLogger("cascade.engines")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def transformers_cli() -> list[str]:
    exe = shutil.which("transformers", path=str(Path(sys.executable).parent)) or shutil.which("transformers")
    if exe is None:
        raise ConfigError("`transformers` CLI not found: install the embedded extra (see README, `make serve`)")
    return [exe]


def worker_command(model_dir: Path, port: int, config: WorkerConfig) -> list[str]:
    return [
        *transformers_cli(), "serve", str(model_dir),
        "--continuous-batching", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
        "--cb-num-blocks", str(config.cb_num_blocks), "--cb-max-batch-tokens", str(config.cb_max_batch_tokens),
        "--log-level", "warning", "--format", "quiet",
    ]


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # Weights come from our cache only; never let the hub client try the network.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    # OpenMP threads that sleep when idle instead of spinning: the workers share the cores with each
    # other, the gateway and their own HTTP threads. Measured on 2 cores, both workers loaded at once:
    # SmolLM2 9.3 -> 19.0 tok/s, Qwen 4.7 -> 6.9 tok/s; Qwen loaded alone: unchanged (8.0-9.2 vs 8.6).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    hub = Path(env.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    hub.mkdir(parents=True, exist_ok=True)  # transformers serve needs it to exist (FACTS.md)
    return env


class Worker:
    """One engine process. By default `transformers serve` of `model_dir`; `command` (with its port
    in it, which must then be `config.port`) and `env` (default: `worker_env()`) run anything else."""

    def __init__(self, config: WorkerConfig, model_dir: Path, log_dir: Path, *, command: list[str] | None = None,
                 env: dict[str, str] | None = None, first_generation: bool | None = None,
                 serves_http: bool = True, health_timeout_s: float = 2.0) -> None:
        if command is not None and not config.port:
            raise ValueError("a worker with its own command needs config.port (the port its command serves on)")
        self.config = config
        self.model_dir = model_dir
        self.port = config.port or free_port()
        self.log_path = log_dir / f"{config.name}.log"
        self.command = command
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.log_pump: LogPump | None = None
        self.restarts = 0
        # Start-up ends with one real generation (default: for `transformers serve` workers; see wait_healthy).
        self.first_generation = command is None if first_generation is None else first_generation
        # False for a process that serves no HTTP (a multi-node SGLang replica's rank > 0): it counts as
        # started once running, and is supervised by liveness alone.
        self.serves_http = serves_http
        # One start-up /health probe's timeout (an SGLang engine's runs a one-token generation: 1-20 s).
        self.health_timeout_s = health_timeout_s

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # A new session: the worker and anything it spawns form one process group we can kill. Its output goes
        # through a pump (cascade/engines/worker_log.py) that leaves out health-probe lines and caps the file.
        self.process = subprocess.Popen(
            self.command or worker_command(self.model_dir, self.port, self.config), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=worker_env() if self.env is None else self.env, start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        assert self.process.stdout is not None
        self.log_pump = LogPump(self.process.stdout, self.log_path).start()
        log.info("worker %s: pid %d on %s", self.config.name, self.process.pid, self.url)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=5)

    def tail(self, lines: int = 15) -> str:
        if self.log_pump is not None and not self.alive():
            self.log_pump.join(2.0)  # an exited worker's last lines may still be on their way to the file
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _die_with_parent() -> None:
    """Linux: kill the worker if its parent dies without cleaning up (e.g. SIGKILL). SIGKILL, not SIGTERM:
    a worker in graceful shutdown waits for its in-flight generations, which then run for nobody."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


async def wait_healthy(worker: Worker, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    if not worker.serves_http:
        if not worker.alive():
            raise ConfigError(f"worker `{worker.config.name}` exited while starting; its log:\n{worker.tail()}")
        return
    async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
        while time.monotonic() < deadline:
            if not worker.alive():
                raise ConfigError(f"worker `{worker.config.name}` exited while starting; its log:\n{worker.tail()}")
            try:
                probe_s = max(0.1, min(worker.health_timeout_s, deadline - time.monotonic()))
                if (await client.get(f"{worker.url}/health", timeout=probe_s)).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.25)
        else:
            raise ConfigError(f"worker `{worker.config.name}` not healthy after {timeout_s:g} s; "
                              f"log: {worker.log_path}")
        if worker.first_generation:
            await _first_generation(client, worker, deadline)


def sampling_fields(model_dir: Path, config: WorkerConfig) -> dict[str, object]:
    """The request fields that make a worker sample (sent at start-up and with every request): the generation
    config as transformers serve reads it (a JSON string: the model's own, for its eos and pad tokens, with
    do_sample, temperature and top_p), and temperature and top_p themselves, which the engine applies over that
    config (a request's `temperature: 0` would otherwise turn sampling off for the whole worker). Continuous
    batching keeps the first request's config for every request; after a restart a user's may be first."""
    path = model_dir / "generation_config.json"
    base = json.loads(path.read_text()) if path.exists() else {}
    sampling = {"temperature": config.temperature, "top_p": config.top_p}
    return {"generation_config": json.dumps({**base, "do_sample": True, **sampling}), **sampling}


async def _first_generation(client: httpx.AsyncClient, worker: Worker, deadline: float) -> None:
    """One 1-token generation before the worker counts as started: transformers sizes its KV cache at the
    first batch, so a cache that does not fit fails here with the engine's reason, not on a user's request;
    it also takes the first batch's one-off cost out of the first request's latency, and it fixes how the
    worker decodes every later request (continuous batching keeps this request's generation config)."""
    body: dict[str, object] = {"model": str(worker.model_dir), "messages": [{"role": "user", "content": "Hi"}],
                               "max_tokens": 1, "stream": False}
    if worker.config.temperature > 0:
        body.update(sampling_fields(worker.model_dir, worker.config))
    try:
        response = await client.post(f"{worker.url}/v1/chat/completions", json=body,
                                     timeout=max(1.0, deadline - time.monotonic()))
    except httpx.HTTPError as exc:
        raise ConfigError(f"worker `{worker.config.name}` did not answer its first generation: {exc!r}; "
                          f"log: {worker.log_path}") from None
    if response.status_code != 200:
        raise ConfigError(f"worker `{worker.config.name}` failed its first generation (HTTP {response.status_code}): "
                          f"{response.text[:300]}; check [[workers]] cb_num_blocks / cb_max_batch_tokens")


class Supervisor:
    """Owns the workers: `start()` brings them all up; `watch()` restarts crashed ones; `stop()` (idempotent)
    ends them all. As an async context manager it starts them on entry and stops them on any exit, an
    exception or a cancellation included (a start that fails or is cancelled stops what it started)."""

    def __init__(self, workers: list[Worker], check_every_s: float = 1.0) -> None:
        self.workers = workers
        self.check_every_s = check_every_s
        self._watch_task: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        for worker in self.workers:
            worker.start()
        try:
            await asyncio.gather(*(wait_healthy(w, w.config.startup_timeout_s) for w in self.workers))
        except BaseException:
            self.stop()
            raise
        self._watch_task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.check_every_s)
            for worker in self.workers:
                if worker.alive() or self._stopping:
                    continue
                code = worker.process.returncode if worker.process else None
                if worker.restarts >= worker.config.max_restarts:
                    log.error("worker %s exited (%s) and reached max_restarts=%d; not restarting",
                              worker.config.name, code, worker.config.max_restarts)
                    continue
                worker.restarts += 1
                backoff = min(30.0, 2.0 ** worker.restarts)
                log.warning("worker %s exited with %s; restart %d in %.0f s", worker.config.name, code,
                            worker.restarts, backoff)
                await asyncio.sleep(backoff)
                if self._stopping:
                    return
                worker.start()

    async def __aenter__(self) -> Supervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping = True
        if self._watch_task is not None:
            self._watch_task.cancel()
        for worker in self.workers:
            worker.stop()
