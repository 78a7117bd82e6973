"""Bounded waits: `eventually` polls a condition, `wait_http` waits for a URL to answer while watching the
process that should serve it (`answers`: whether it does now).

Only the standard library at import time.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path


def eventually(condition: Callable[[], bool], within_s: float = 2.0) -> bool:
    """Poll `condition` (e.g. a fake engine's stats) until it holds or `within_s` has passed."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


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
            raise RuntimeError(f"{url}: process exited with {proc.returncode}:\n{log_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not ready after {timeout_s:g} s:\n{log_tail(log)}")
        time.sleep(0.1)


def log_tail(log: Path | None) -> str:
    return log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
