"""Processes for tests and benchmarks: `start` runs a command in its own process group (so that stopping it reaches
whatever it started), `stop` ends the group (SIGTERM, then SIGKILL after a grace), `process` does both around a
block, `run` runs a command to completion with a bound. `CASCADE` is the command line of `cascade` itself.

Only the standard library at import time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CASCADE = [sys.executable, "-m", "cascade.cli"]


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
