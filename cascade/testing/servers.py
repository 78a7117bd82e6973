"""Servers a test or a benchmark runs as subprocesses, each on 127.0.0.1 at a free port and killed when its block
exits, whatever happened: `fake_engine` (`cascade fake-server`), `serve_config` and `cascade_serve` (`cascade
serve`, on a config of the caller's or on `ladder_toml`'s three tiers), `redis_server` (Debian's `redis-server`,
for the shared limits).

Only the standard library at import time (and cascade's own free_port).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cascade.engines.supervisor import free_port
from cascade.testing.processes import CASCADE, process, start, stop
from cascade.testing.waiting import log_tail, wait_http

TIERS = ("tier-small", "tier-medium", "tier-large")


@contextmanager
def fake_engine(log_dir: Path, *args: str, within_s: float = 30.0) -> Iterator[str]:
    """`cascade fake-server ARGS` on a free loopback port; yields its base URL."""
    port = free_port()
    url, log = f"http://127.0.0.1:{port}", log_dir / f"engine-{port}.log"
    with process([*CASCADE, "fake-server", "--host", "127.0.0.1", "--port", str(port), *args], log) as proc:
        try:
            wait_http(f"{url}/health", proc, log, within_s)
        except RuntimeError as exc:
            raise RuntimeError(f"the fake engine did not start: {exc}") from None
        yield url


class Served:
    """A running `cascade serve`: its process, base URL and log."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log
        self.port = int(url.rsplit(":", 1)[1])

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, within_s: float) -> float:
        """Seconds until the process exited (AssertionError after `within_s`)."""
        start_s = time.monotonic()
        try:
            self.proc.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the gateway did not exit within {within_s} s:\n{self.output()}") from None
        return time.monotonic() - start_s


@contextmanager
def serve_config(log_dir: Path, config_toml: str, within_s: float = 60,
                 preexec: Callable[[], None] | None = None) -> Iterator[Served]:
    """`cascade serve --config` on a config of the caller's, once it answers /health (at most `within_s`)."""
    port = free_port()
    config, log = log_dir / f"gateway-{port}.toml", log_dir / f"gateway-{port}.log"
    config.write_text(config_toml)
    url = f"http://127.0.0.1:{port}"
    with process([*CASCADE, "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)], log,
                 preexec=preexec) as proc:
        try:
            wait_http(f"{url}/health", proc, log, within_s)
        except RuntimeError:
            raise RuntimeError(f"the gateway did not start: {log.read_text()}") from None
        yield Served(proc, url, log)


@contextmanager
def cascade_serve(log_dir: Path, engine_url: str, gateway_toml: str = "",
                  preexec: Callable[[], None] | None = None) -> Iterator[Served]:
    """`cascade serve` over `ladder_toml`'s three tiers (every tier on `engine_url`); `gateway_toml` is the
    config's head (e.g. a [gateway] table)."""
    with serve_config(log_dir, ladder_toml(engine_url, gateway_toml), preexec=preexec) as served:
        yield served


def ladder_toml(engine_url: str, extra: str = "", read_s: float = 5.0, dead_url: str | None = None) -> str:
    """Three tiers (TIERS) on one fake engine, models fake-0..2; `dead_url` replaces the last tier's engine."""
    tiers = []
    for i, name in enumerate(TIERS):
        url = dead_url if (dead_url and i == len(TIERS) - 1) else engine_url
        timeouts = f"{{ connect_s = 1.0, read_s = {read_s} }}"
        tiers.append(f"""
[[tiers]]
name = "{name}"
default_max_tokens = 32
backends = [{{ kind = "openai", url = "{url}", model = "fake-{i}", timeouts = {timeouts} }}]
""")
    return extra + "\n" + "".join(tiers)


class RedisServer:
    """A `redis-server` on 127.0.0.1 (no persistence) that a test may kill, pause and start again on its port."""

    def __init__(self, log_dir: Path, binary: str) -> None:
        self.binary, self.port = binary, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log = log_dir / f"redis-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, within_s: float = 10.0) -> None:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = start(argv, self.log, append=True)
        deadline = time.monotonic() + within_s
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}:\n{log_tail(self.log)}")
            time.sleep(0.05)

    def ping(self) -> bool:
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: gone at once, with its data."""
        if self.proc is not None:
            stop(self.proc, grace_s=0)
            self.proc = None

    def pause(self) -> None:
        """SIGSTOP: connections stay open and nothing answers (a hung Redis) until `resume`."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)


@contextmanager
def redis_server(log_dir: Path, binary: str = "redis-server") -> Iterator[RedisServer]:
    """A `RedisServer` started (PING answered) on a free loopback port, always killed when the block exits."""
    import shutil

    found = shutil.which(binary)
    if found is None:
        raise FileNotFoundError(f"{binary} is not installed")
    server = RedisServer(log_dir, found)
    try:
        server.start()
        yield server
    finally:
        if server.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.proc.pid, signal.SIGCONT)  # a paused one must not outlive the test either
        server.kill()
