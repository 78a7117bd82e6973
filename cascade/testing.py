"""Helpers shared by the tests and the benchmarks (never imported by cascade itself: an import-linter contract).

Processes: `start` runs a command in its own process group (so that stopping it reaches whatever it started),
`stop` ends the group (SIGTERM, then SIGKILL after a grace), `process` does both around a block, `run` runs a
command to completion with a bound, `wait_http` waits, bounded, for a URL to answer while watching the process.
On top: `fake_engine` (`cascade fake-server`), `serve_config` and `cascade_serve` (`cascade serve`), and
`redis_server` (Debian's `redis-server`, for the shared limits), each on 127.0.0.1 at a free port and killed when its
block exits, whatever happened. In-process: `serve_asgi` serves an
ASGI app with uvicorn in a thread. `eventually` polls a condition with a bound; `fail` is a benchmark's one-line
error exit.

Only the standard library at import time (and cascade's own free_port); uvicorn is imported when used.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from cascade.engines.supervisor import free_port

CASCADE = [sys.executable, "-m", "cascade.cli"]
TIERS = ("tier-small", "tier-medium", "tier-large")


def fail(message: str, prog: str | None = None) -> int:
    """Print `prog: message` to stderr (default prog: the running script's name) and return exit status 2."""
    print(f"{prog or Path(sys.argv[0]).stem}: {message}", file=sys.stderr)
    return 2


def eventually(condition: Callable[[], bool], within_s: float = 2.0) -> bool:
    """Poll `condition` (e.g. a fake engine's stats) until it holds or `within_s` has passed."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# --- processes -------------------------------------------------------------------------------------


def start(argv: Sequence[str], log: Path | None = None, *, preexec: Callable[[], None] | None = None,
          cwd: Path | str | None = None, append: bool = False) -> subprocess.Popen[bytes]:
    """`argv` in its own process group, stdout and stderr to `log` (default: discarded), no stdin."""
    with contextlib.ExitStack() as stack:
        out: Any = (stack.enter_context(log.open("ab" if append else "wb")) if log is not None
                    else subprocess.DEVNULL)  # the child keeps its own copy of the descriptor
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=preexec, cwd=cwd)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> int | None:
    """End `proc`'s process group: SIGTERM, then SIGKILL if it has not exited after `grace_s` (0: SIGKILL at
    once). Returns its exit status (None if even SIGKILL did not end it within 10 s)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if sig == signal.SIGTERM and grace_s <= 0:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(wait_s)
    return proc.poll()


@contextmanager
def process(argv: Sequence[str], log: Path | None = None, *, preexec: Callable[[], None] | None = None,
            cwd: Path | str | None = None, grace_s: float = 0.0) -> Iterator[subprocess.Popen[bytes]]:
    """`start(argv)` for the block; on exit its whole group is stopped (`stop` with `grace_s`: default SIGKILL)."""
    proc = start(argv, log, preexec=preexec, cwd=cwd)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            stop(proc, grace_s)
        else:  # it exited, but something it started may still hold the group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def run(argv: Sequence[str], timeout_s: float, cwd: Path | str | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run `argv` to completion in its own process group, capturing stdout and stderr; past `timeout_s` the
    whole group is killed and TimeoutExpired raised (a script, its loadgen and its fake engine go together)."""
    proc = subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            stop(proc, grace_s=0)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def answers(url: str, timeout_s: float = 1.0) -> bool:
    """Whether GET `url` (e.g. `http://127.0.0.1:PORT/health`) answers 200."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def wait_http(url: str, proc: subprocess.Popen[bytes] | None = None, log: Path | None = None,
              timeout_s: float = 60.0) -> None:
    """Wait until GET `url` answers 200; RuntimeError, with the end of `log`, when `proc` exits
    first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not answers(url):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not ready after {timeout_s:g} s:\n{_tail(log)}")
        time.sleep(0.1)


def _tail(log: Path | None) -> str:
    return log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""


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
                raise RuntimeError(f"redis-server did not start on port {self.port}:\n{_tail(self.log)}")
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


# --- in-process servers ----------------------------------------------------------------------------


@contextmanager
def serve_asgi(app: Any, lifespan: Literal["off", "on"] = "off", startup_timeout_s: float = 10.0) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 at a free port (uvicorn, in a thread) and yield its base URL; it is stopped
    when the block exits, even on failure."""
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan=lifespan,
                            access_log=False, timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"test-server-{type(app).__name__}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.002)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        if thread.is_alive():  # a handler that ignores cancellation: stop waiting for it
            server.force_exit = True
            thread.join(timeout=5)
