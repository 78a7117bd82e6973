"""SGLang's model gateway (`smg`, the version benchmarks/frontdoor/peer_gateways.py pins, in its throwaway venv) in
front of emulated engines: arm a's front (round robin over the plain tier's replicas) and, in arm g, each tier's
replica picker (`cache_aware`) behind cascade.

What cascade meets when a tier's one backend is an smg 1.13.0 instead of the engines (probed against the GPU
emulator, tests/benchmarks/planner/test_goodput_smg.py; the routes are smg's model_gateway/src/server.rs):

* the chat route forwards the body, `rid` included, to the worker it picks, and streams back;
* `POST /abort_request` is not a route (404): cascade's abort of a pruned branch or of a cut client is lost. The
  engine stops that generation only once it notices the closed connection (smg drops its upstream stream when
  cascade drops its own), as SGLang does for any client that goes away;
* `GET /metrics` is not served on its main port (404: smg's own series are on `--prometheus-port`, the engines'
  under `/engine_metrics`), so cascade's engine poller never gets a reading and the tier's load is the gateway's own
  counters (cascade/service/engine_load.py).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchmarks.frontdoor.peer_gateways import PEER_CACHE, peer_exe, smg_argv
from cascade.engines.supervisor import free_port
from cascade.testing.processes import start, stop
from cascade.testing.waiting import log_tail, wait_http

READY_S = 60.0  # smg answers /health at once and registers its workers (health-checked) within a few seconds
STOP_GRACE_S = 2.0  # smg drains in-flight requests for 180 s on SIGTERM by default: SIGKILL after this


def available(work: Path) -> Path | str:
    """smg's entry point (installed into its venv if missing), or why it is not there."""
    work.mkdir(parents=True, exist_ok=True)
    return peer_exe("smg", PEER_CACHE, work / "smg-install.log")


@contextlib.contextmanager
def gateway(workers: Sequence[str], policy: str, work: Path, name: str = "smg", ready_s: float = READY_S
            ) -> Iterator[str]:
    """One smg on 127.0.0.1 over `workers` with `policy` for the block (its log: `work`/`name`.log); yields its URL
    once every worker is registered. RuntimeError (with its log's end) if smg is not available or not ready within
    `ready_s`; stopped on the way out, whatever happened."""
    exe = available(work)
    if isinstance(exe, str):
        raise RuntimeError(f"smg is not available: {exe}")
    port, log = free_port(), work / f"{name}.log"
    proc = start(smg_argv(exe, port, workers, free_port(), policy), log)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + ready_s
        wait_http(f"{url}/health", proc, log, ready_s)
        wait_registered(url, len(workers), proc, log, max(0.0, deadline - time.monotonic()))
        yield url
    finally:
        stop(proc, grace_s=STOP_GRACE_S)


def wait_registered(url: str, count: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    """Until smg lists `count` workers (its /health answers before it has registered any)."""
    deadline, listed = time.monotonic() + timeout_s, -1
    while listed < count:
        if proc.poll() is not None:
            raise RuntimeError(f"smg exited with {proc.returncode}:\n{log_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"smg listed {listed} of {count} workers after {timeout_s:g} s:\n{log_tail(log)}")
        time.sleep(0.2)
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError), \
                urllib.request.urlopen(f"{url}/workers", timeout=5) as r:
            listed = int(json.load(r)["total"])
