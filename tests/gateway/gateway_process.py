"""`cascade serve` and `cascade fake-server` as real subprocesses, for the connection and shutdown tests.

Both bind 127.0.0.1 on a free port, run in their own process group, and are killed (SIGKILL to the
group) when their block exits, whatever happened; every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from cascade.engines.supervisor import free_port
from tests.gateway.gateway_setup import ladder_toml
from tests.servers import eventually

CASCADE = [sys.executable, "-m", "cascade.cli"]


@contextmanager
def process(args: list[str], log: Path, preexec: Callable[[], None] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:  # its own group: the kill below reaches anything it started
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=preexec)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def fake_engine(tmp_path: Path, *args: str) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with process([*CASCADE, "fake-server", "--host", "127.0.0.1", "--port", str(port), *args],
                 tmp_path / f"engine-{port}.log") as proc:
        if not eventually(lambda: answers(url) or proc.poll() is not None, within_s=30) or proc.poll() is not None:
            raise RuntimeError(f"the fake engine did not start: {(tmp_path / f'engine-{port}.log').read_text()}")
        yield url


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log
        self.port = int(url.rsplit(":", 1)[1])

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, within_s: float) -> float:
        """Seconds until the process exited (fails the test after `within_s`)."""
        start = time.monotonic()
        try:
            self.proc.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the gateway did not exit within {within_s} s:\n{self.output()}") from None
        return time.monotonic() - start


@contextmanager
def cascade_serve(tmp_path: Path, engine_url: str, gateway_toml: str = "",
                  preexec: Callable[[], None] | None = None) -> Iterator[Served]:
    """`cascade serve` over the three-tier ladder of gateway_setup (every tier on `engine_url`);
    `gateway_toml` is the config's head (e.g. a [gateway] table)."""
    with serve_config(tmp_path, ladder_toml(engine_url, gateway_toml), preexec=preexec) as served:
        yield served


@contextmanager
def serve_config(tmp_path: Path, config_toml: str, within_s: float = 60,
                 preexec: Callable[[], None] | None = None) -> Iterator[Served]:
    """`cascade serve --config` on a config of the caller's, once it answers /health (at most `within_s`)."""
    port = free_port()
    config = tmp_path / f"gateway-{port}.toml"
    config.write_text(config_toml)
    log = tmp_path / f"gateway-{port}.log"
    url = f"http://127.0.0.1:{port}"
    with process([*CASCADE, "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)], log,
                 preexec) as proc:
        if not eventually(lambda: answers(url) or proc.poll() is not None, within_s=within_s) or proc.poll() is not None:
            raise RuntimeError(f"the gateway did not start: {log.read_text()}")
        yield Served(proc, url, log)
