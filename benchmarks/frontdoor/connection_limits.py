"""The gateway's connection-level limits, measured (prints JSON; run from the repo root).

  1. RSS of `cascade serve` before and after one request with a 200 MB header (and what the client got).
  2. With 1,100 idle TCP connections open: does a normal chat request still succeed?

The gateway runs with RLIMIT_NOFILE soft 1024 (the tester's default), hard unchanged, in front of a fake
engine; both subprocesses bind 127.0.0.1 and are killed in `finally`.
Usage: .venv/bin/python -m benchmarks.frontdoor.connection_limits [--header-mb 200] [--idle 1100]
"""
from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from cascade.engines.supervisor import free_port
from cascade.testing.processes import CASCADE, start, stop
from cascade.testing.scripts import print_result
from cascade.testing.servers import ladder_toml
from cascade.testing.waiting import wait_http


def rss_mb(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    vals = {line.split(":")[0]: line.split()[1] for line in status.splitlines() if line.startswith(("VmRSS", "VmHWM"))}
    return int(vals["VmRSS"]) / 1024, int(vals["VmHWM"]) / 1024


def soft_nofile(n: int, hard_too: bool):
    def apply() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n if hard_too else hard))
    return apply


def big_header(port: int, mb: int) -> str:
    chunk = b"a" * (1 << 20)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        try:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: ")
            for _ in range(mb):
                sock.sendall(chunk)
            sock.sendall(b"\r\ncontent-length: 2\r\n\r\n{}")
        except OSError as exc:
            sent = f"send failed: {exc!r}; "
        else:
            sent = "sent all; "
        try:
            sock.settimeout(30)
            reply = sock.recv(4096)
            return sent + (reply.split(b"\r\n", 1)[0].decode(errors="replace") if reply else "EOF, no reply")
        except OSError as exc:
            return sent + f"recv failed: {exc!r}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--header-mb", type=int, default=200)
    parser.add_argument("--idle", type=int, default=1100)
    parser.add_argument("--gateway-nofile", type=int, default=1024)
    parser.add_argument("--hard-too", action="store_true", help="also set the hard limit (no raise possible)")
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this client holds the idle connections
    procs: list[subprocess.Popen] = []
    result: dict = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            eport, gport = free_port(), free_port()
            procs.append(start([*CASCADE, "fake-server", "--port", str(eport), "--tokens", "8"]))
            wait_http(f"http://127.0.0.1:{eport}/health", procs[-1], timeout_s=30)
            cfg = Path(tmp) / "c.toml"
            cfg.write_text(ladder_toml(f"http://127.0.0.1:{eport}"))
            log = Path(tmp) / "gw.log"
            gw = start([*CASCADE, "serve", "--config", str(cfg), "--host", "127.0.0.1", "--port", str(gport),
                        "--log-level", "warning"], log, preexec=soft_nofile(args.gateway_nofile, args.hard_too),
                       cwd=tmp)
            procs.append(gw)
            base = f"http://127.0.0.1:{gport}"
            wait_http(f"{base}/health", gw, log, timeout_s=30)
            body = {"model": "cascade", "messages": [{"role": "user", "content": "hi"}]}
            assert httpx.post(f"{base}/v1/chat/completions", json=body, timeout=10).status_code == 200
            limits = Path(f"/proc/{gw.pid}/limits").read_text()
            result["gateway_nofile"] = next(line.split()[3:5] for line in limits.splitlines() if "open files" in line)
            rss0, _ = rss_mb(gw.pid)
            t0 = time.monotonic()
            result["big_header_client_saw"] = big_header(gport, args.header_mb)
            result["big_header_s"] = round(time.monotonic() - t0, 2)
            time.sleep(1.0)
            rss1, hwm = rss_mb(gw.pid)
            result["rss_mb"] = {"before": round(rss0, 1), "after": round(rss1, 1), "peak": round(hwm, 1)}
            result["gateway_alive_after_header"] = gw.poll() is None
            # 1,100 idle connections, then one normal request
            idle: list[socket.socket] = []
            refused = 0
            for _ in range(args.idle):
                s = socket.socket()
                s.settimeout(5)
                try:
                    s.connect(("127.0.0.1", gport))
                    idle.append(s)
                except OSError:
                    refused += 1
                    s.close()
            time.sleep(1.5)
            result["idle_connected"] = len(idle)
            try:
                r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=15)
                result["request_with_idle_open"] = f"{r.status_code} {r.text[:120]}"
            except httpx.HTTPError as exc:
                result["request_with_idle_open"] = f"failed: {exc!r}"
            open_fds = len(os.listdir(f"/proc/{gw.pid}/fd"))
            result["gateway_open_fds"] = open_fds
            # how many idle connections did the gateway drop (EOF) by now?
            dropped = 0
            for s in idle:
                s.setblocking(False)
                try:
                    if s.recv(1 << 16) == b"":
                        dropped += 1
                    else:
                        dropped += 1  # got a reply (e.g. a 503) before the close
                except BlockingIOError:
                    pass
                except OSError:
                    dropped += 1
            result["idle_dropped_by_gateway_within_2s"] = dropped
            for s in idle:
                s.close()
            time.sleep(0.5)
            try:
                r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=15)
                result["request_after_idle_closed"] = r.status_code
            except httpx.HTTPError as exc:
                result["request_after_idle_closed"] = f"failed: {exc!r}"
            result["gateway_log_tail"] = log.read_text()[-600:]
    finally:
        for p in procs:
            stop(p, grace_s=0)
    print_result(result, args.json_out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
