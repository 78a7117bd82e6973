"""Slow clients on real sockets (cascade/gateway/connections.py): a request pipelined behind another gets the
header and body timeouts like the first request of a connection, a request queued behind a long response is not
timed out for the gateway's own time, and forty slow connections (trickled bodies, alone and pipelined behind a
`GET /health`, and trickled headers) cost the normal clients nothing measurable."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from cascade.testing.servers import Served, cascade_serve, fake_engine
from cascade.testing.waiting import eventually
from tests.gateway.gateway_setup import user

TIMEOUT_S = 1.5
LIMITS = f"""
[gateway.limits]
header_timeout_s = {TIMEOUT_S}
body_timeout_s = {TIMEOUT_S}
keepalive_timeout_s = 30
"""
MARGIN_S = 3.0  # how much later than its timeout a connection may be answered (a bound on hangs, not a measure)
HEALTH = b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
SLOW_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: "
# A body that never ends: 100,000 bytes announced, a byte at a time sent.
SLOW_BODY = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
             b"content-length: 100000\r\n\r\n{")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A gateway with short header and body timeouts, on a fake engine of its own."""
    tmp = tmp_path_factory.mktemp("slow_clients")
    with fake_engine(tmp, "--tokens", "4") as engine, cascade_serve(tmp, engine, LIMITS) as served:
        yield served


def chat_request(text: str = "hello") -> bytes:
    body = httpx.Request("POST", "http://x", json={"model": "tier-small", "messages": user(text)}).read()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body) + body)


def statuses(raw: bytes) -> list[int]:
    """The status of each response in `raw`, one after another (each with a content-length)."""
    codes = []
    while raw.startswith(b"HTTP/1.1 "):
        head, _, rest = raw.partition(b"\r\n\r\n")
        codes.append(int(head[9:12]))
        length = re.search(rb"\r\ncontent-length: (\d+)", head, re.IGNORECASE)
        raw = rest[int(length.group(1)) if length else len(rest):]
    return codes


def answers_until_closed(served: Served, data: bytes, within_s: float) -> tuple[list[int], bytes, float]:
    """Send `data` at once on a new connection; the statuses and bytes it gets until the gateway closes it, and when."""
    start = time.monotonic()
    received = b""
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.settimeout(within_s)
        sock.sendall(data)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pass  # still open: the caller's assertion on the time says so
    return statuses(received), received, time.monotonic() - start


def test_a_slow_body_pipelined_behind_a_request_gets_408_within_the_body_timeout(gateway: Served) -> None:
    codes, raw, elapsed = answers_until_closed(gateway, HEALTH + SLOW_BODY, TIMEOUT_S + MARGIN_S)
    assert codes == [200, 408], raw
    assert b"request body did not arrive within" in raw
    assert elapsed < TIMEOUT_S + MARGIN_S


def test_a_slow_head_pipelined_behind_a_request_gets_408_within_the_header_timeout(gateway: Served) -> None:
    # Before, the head behind the response was left to the keep-alive timer (here 30 s).
    codes, raw, elapsed = answers_until_closed(gateway, HEALTH + SLOW_HEAD, TIMEOUT_S + MARGIN_S)
    assert codes == [200, 408], raw
    assert b"request headers did not arrive within" in raw
    assert elapsed < TIMEOUT_S + MARGIN_S


def test_pipelined_requests_queued_behind_a_response_longer_than_the_timeouts_are_all_served(gateway: Served) -> None:
    # The first response takes twice the timeouts; the requests behind it arrive at once, one body in two parts (its
    # second part is read only once the first response ends): the gateway's time is not counted against them.
    slow = chat_request(f"[fake ttft_ms={int(TIMEOUT_S * 2000)}]")
    head, _, body = chat_request().partition(b"\r\n\r\n")
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(slow + HEALTH + head.replace(b"host:", b"connection: close\r\nhost:") + b"\r\n\r\n" + body[:10])
        time.sleep(0.2)
        sock.sendall(body[10:])
        received = b""
        sock.settimeout(TIMEOUT_S * 2 + MARGIN_S + 5)
        while chunk := sock.recv(65536):
            received += chunk
    assert statuses(received) == [200, 200, 200], received


@dataclass
class SlowClients:
    """`count` connections that each send a request's start and then a byte every `every_s`, never finishing it;
    a connection the gateway closes is replaced at once. Kinds in turn: a trickled body, a trickled body behind a
    `GET /health` (pipelined), trickled headers."""

    port: int
    count: int = 40
    every_s: float = 0.25
    closed: list[tuple[float, bytes]] = field(default_factory=list)  # each: its lifetime, what it was answered
    _stop: threading.Event = field(default_factory=threading.Event)
    _opened: int = 0

    def _open(self) -> tuple[socket.socket, float, bytearray]:
        kind = (SLOW_BODY, HEALTH + SLOW_BODY, SLOW_HEAD)[self._opened % 3]
        self._opened += 1
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.sendall(kind)
        sock.setblocking(False)
        return sock, time.monotonic(), bytearray()

    def run(self) -> None:
        live = [self._open() for _ in range(self.count)]
        try:
            while not self._stop.wait(self.every_s):
                for i, (sock, opened, got) in enumerate(live):
                    gone = False
                    try:
                        sock.send(b"a")
                        while chunk := sock.recv(65536):
                            got += chunk
                        gone = True  # b"": closed by the gateway
                    except BlockingIOError:
                        pass
                    except OSError:
                        gone = True
                    if gone:
                        sock.close()
                        self.closed.append((time.monotonic() - opened, bytes(got)))
                        live[i] = self._open()
        finally:
            for sock, _, _ in live:
                sock.close()

    def __enter__(self) -> SlowClients:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def latencies(url: str, count: int) -> tuple[list[float], int]:
    """`count` chat completions one after another on one keep-alive client: their latencies, and the failures."""
    times, errors = [], 0
    with httpx.Client(base_url=url, timeout=10, trust_env=False) as client:
        for _ in range(count):
            start = time.perf_counter()
            try:
                ok = client.post("/v1/chat/completions",
                                 json={"model": "tier-small", "messages": user()}).status_code == 200
            except httpx.HTTPError:
                ok = False
            times.append(time.perf_counter() - start)
            errors += not ok
    return times, errors


def p99(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


REQUESTS = 300
FLOOR_S = 0.010  # absolute slack on top of the 10 %: scheduling noise of a shared CPU, not the slow clients' cost


def test_forty_slow_connections_leave_normal_clients_served_within_ten_percent_p99(gateway: Served) -> None:
    latencies(gateway.url, 20)  # warm up
    open_files = len(os.listdir(f"/proc/{gateway.proc.pid}/fd"))
    # Side by side in one run: quiet, under the slow clients, quiet again; the quiet runs together are the baseline.
    quiet, quiet_errors = latencies(gateway.url, REQUESTS // 2)
    with SlowClients(gateway.port) as slow:
        time.sleep(TIMEOUT_S)  # every slow connection open and trickling, the first ones timing out
        loud, loud_errors = latencies(gateway.url, REQUESTS)
        assert eventually(lambda: len(slow.closed) >= slow.count, TIMEOUT_S + MARGIN_S)
    more, more_errors = latencies(gateway.url, REQUESTS // 2)
    baseline = quiet + more
    assert quiet_errors + loud_errors + more_errors == 0
    assert p99(loud) <= 1.10 * p99(baseline) + FLOOR_S, (p99(loud), p99(baseline))
    # The slow connections were cut by the timeouts, each within its timeout and a margin; a pipelined one after its
    # `GET /health` was answered.
    assert len(slow.closed) >= 40
    assert all(lifetime < TIMEOUT_S + MARGIN_S for lifetime, _ in slow.closed), [t for t, _ in slow.closed]
    answers = [statuses(got) for _, got in slow.closed]
    assert all(codes in ([408], [200, 408]) for codes in answers), answers
    assert [200, 408] in answers
    # Their connections are gone once they stop (the file descriptors of the slow connections and of their requests).
    assert eventually(lambda: len(os.listdir(f"/proc/{gateway.proc.pid}/fd")) <= open_files + 2, TIMEOUT_S + MARGIN_S)
