"""Connection-level limits of `cascade serve` (cascade/gateway/connections.py): header size, header,
body and keep-alive timeouts, open connections, the open-files limit, and the exposure warning."""

from __future__ import annotations

import http.client
import json
import logging
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from cascade.config import decode_config
from cascade.gateway import server
from cascade.gateway.connections import GatewayProtocol, connection_cap
from cascade.testing.servers import Served, cascade_serve, fake_engine, ladder_toml
from cascade.testing.waiting import eventually
from tests.gateway.gateway_setup import user
from tests.gateway.test_failover import ladder

TIMEOUT_S = 1.0
LIMITED = f"""
[gateway.limits]
max_header_bytes = 4096
header_timeout_s = {TIMEOUT_S}
body_timeout_s = {TIMEOUT_S}
keepalive_timeout_s = {TIMEOUT_S}
"""
# Long timeouts, so that idle connections stay until the limit closes them.
FEW_CONNECTIONS = """
[gateway.limits]
max_connections = 4
header_timeout_s = 60
keepalive_timeout_s = 60
"""
BOUND_S = 4.0  # how much later than its timeout a connection may be dropped (a bound on hangs)
FILL_S = 30.0  # how long a stream may take to fill a non-reading client's socket buffers


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with fake_engine(tmp_path_factory.mktemp("engine"), "--tokens", "4") as url:
        yield url


@pytest.fixture(scope="module")
def gateway(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with cascade_serve(tmp_path_factory.mktemp("gateway"), engine, LIMITED) as served:
        yield served


def _low_open_files() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


@pytest.fixture(scope="module")
def small_gateway(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """max_connections = 4, started with a soft open-files limit of 256."""
    with cascade_serve(tmp_path_factory.mktemp("small"), engine, FEW_CONNECTIONS, preexec=_low_open_files) as served:
        yield served


def chat(url: str, text: str = "hello", timeout: float = 10, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": "tier-small", "messages": user(text)},
                      headers=headers, timeout=timeout, trust_env=False)


def connect(served: Served) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    sock.settimeout(TIMEOUT_S + BOUND_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def status_and_error(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)["error"]


def test_headers_over_the_limit_get_431_with_an_openai_error(gateway: Served) -> None:
    assert chat(gateway.url, **{"x-padding": "a" * 3000}).status_code == 200
    response = chat(gateway.url, **{"x-padding": "a" * 5000})
    assert response.status_code == 431
    assert response.headers["connection"] == "close"
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "request_header_fields_too_large"
    assert "4096 bytes" in error["message"]
    assert chat(gateway.url).status_code == 200


def test_a_huge_header_is_refused_without_being_buffered(gateway: Served) -> None:
    def peak_rss_mb() -> float:
        status = Path(f"/proc/{gateway.proc.pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1]) / 1024

    before = peak_rss_mb()
    with connect(gateway) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: ")
        for _ in range(32):  # the gateway answers at 4 KB, then reads and discards for a second
            sock.sendall(b"a" * (1 << 20))
        assert sock.recv(65536).startswith(b"HTTP/1.1 431 ")
    assert peak_rss_mb() - before < 16, "the gateway buffered the header"
    assert chat(gateway.url).status_code == 200


def test_a_slow_header_sender_gets_408_after_the_header_timeout(gateway: Served) -> None:
    start = time.monotonic()
    received = b""
    with connect(gateway) as sock:
        sock.settimeout(0.25)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ")
        while time.monotonic() - start < TIMEOUT_S + BOUND_S:
            try:
                sock.sendall(b"a")  # one byte at a time, never the end of the headers
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            received += chunk
    assert time.monotonic() - start < TIMEOUT_S + BOUND_S, "the slow sender was not dropped"
    status, headers, error = status_and_error(received)
    assert (status, headers["connection"], error["code"]) == (408, "close", "request_timeout")


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(gateway: Served) -> None:
    start = time.monotonic()
    with connect(gateway) as sock:
        assert read_until_closed(sock) == b""
    assert time.monotonic() - start >= TIMEOUT_S * 0.9


def test_a_trickled_body_gets_408_after_the_body_timeout(gateway: Served) -> None:
    with connect(gateway) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{\"model\": ")
        status, headers, error = status_and_error(read_until_closed(sock))
    assert (status, headers["connection"], error["code"]) == (408, "close", "request_timeout")
    assert "body" in error["message"]


def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout(gateway: Served) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=TIMEOUT_S + BOUND_S)
    try:
        for _ in range(2):  # the connection is reused within the timeout
            conn.request("GET", "/health")
            response = conn.getresponse()
            assert response.status == 200 and response.getheader("connection") != "close"
            response.read()
        assert conn.sock is not None
        start = time.monotonic()
        assert conn.sock.recv(1) == b""
        assert time.monotonic() - start >= TIMEOUT_S * 0.9
    finally:
        conn.close()


def test_a_client_that_stops_reading_its_stream_is_dropped_after_the_write_timeout(tmp_path: Path) -> None:
    body = json.dumps({"model": "tier-small", "stream": True, "max_tokens": 500_000,
                       "messages": user("[fake tokens=500000]")}).encode()
    limits = f"[gateway.limits]\nwrite_timeout_s = {TIMEOUT_S}\nmax_tokens = 500000\n"
    # An engine of its own: its counters start at 0 and see only this request.
    with fake_engine(tmp_path) as engine, cascade_serve(tmp_path, engine, limits) as served, \
            socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once: the client reads nothing
        sock.connect(("127.0.0.1", served.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n" % len(body) + body)
        assert eventually(lambda: _stats(engine)["streams_started"] == 1, 10)
        # The gateway drops the connection, and with it the upstream stream: the engine stops generating. The write
        # timeout runs from when the socket's buffers are full, which takes the engine's tokens to fill: up to
        # FILL_S on a loaded 2-core machine (a bound on a hang, not a timing).
        assert eventually(lambda: _stats(engine)["streams_cancelled"] == 1, FILL_S + TIMEOUT_S + BOUND_S)
        assert eventually(lambda: _stats(engine)["in_flight"] == 0, BOUND_S)
        assert chat(served.url).status_code == 200  # and the gateway serves on
        assert "read nothing for" in served.output()


def _stats(engine: str) -> dict:
    return httpx.get(f"{engine}/fake/stats", timeout=5, trust_env=False).json()


def test_beyond_max_connections_the_longest_idle_ones_are_closed_to_admit_new_ones(small_gateway: Served) -> None:
    idle = [connect(small_gateway) for _ in range(10)]
    try:
        assert chat(small_gateway.url).status_code == 200
        # 4 admitted at most: the 10th connection and the request's evicted the 7 that waited longest.
        for sock in idle:
            sock.setblocking(False)

        def closed(sock: socket.socket) -> bool:
            try:
                return sock.recv(1) == b""
            except BlockingIOError:
                return False

        assert eventually(lambda: all(closed(s) for s in idle[:7]), within_s=BOUND_S)
        assert not any(closed(s) for s in idle[7:])
    finally:
        for sock in idle:
            sock.close()


def test_beyond_max_connections_with_every_one_busy_new_ones_get_503(small_gateway: Served, engine: str) -> None:
    request = json.dumps({"model": "tier-small", "messages": user("[fake ttft_ms=2000]")}).encode()
    busy = [connect(small_gateway) for _ in range(4)]
    try:
        for sock in busy:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                         b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(request), request))
        assert eventually(lambda: httpx.get(f"{engine}/fake/stats", trust_env=False).json()["in_flight"] == 4,
                          within_s=BOUND_S)
        refused = chat(small_gateway.url)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "too_many_connections"
        for sock in busy:  # the admitted requests are served
            sock.settimeout(10)
            assert read_until_closed(sock).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in busy:
            sock.close()


def test_cascade_serve_raises_the_soft_open_files_limit(small_gateway: Served) -> None:
    limits = Path(f"/proc/{small_gateway.proc.pid}/limits").read_text()
    soft, hard = next(line for line in limits.splitlines() if line.startswith("Max open files")).split()[3:5]
    assert int(soft) > 256
    assert hard == "unlimited" or int(soft) == min(int(hard), 1 << 20)


def test_max_connections_is_lowered_to_half_the_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
    try:
        assert connection_cap(4096) == (512 - 64) // 2
        assert connection_cap(100) == 100
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize(("host", "keys", "warns"), [
    ("0.0.0.0", (), True),
    ("::", (), True),
    ("10.1.2.3", (), True),
    ("gateway.internal", (), True),
    ("0.0.0.0", ("sk-1",), False),
    ("127.0.0.1", (), False),
    ("::1", (), False),
    ("localhost", (), False),
])
def test_a_bind_beyond_loopback_without_api_keys_is_warned_about(host: str, keys: tuple[str, ...], warns: bool) -> None:
    line = server.exposure_warning(host, keys)
    assert (line is not None) == warns
    if line:
        assert host in line and "api_keys" in line and "\n" not in line


@pytest.mark.parametrize(("host", "keyed", "monitoring_port", "opt_in", "served"), [
    ("0.0.0.0", True, 0, None, False),  # each key's spend, to the network: not unless asked
    ("0.0.0.0", True, 0, True, True),
    ("0.0.0.0", True, 9464, None, False),  # on the monitoring port instead
    ("0.0.0.0", True, 9464, True, False),
    ("0.0.0.0", False, 0, None, True),  # no keys: no per-key series
    ("0.0.0.0", False, 0, False, False),
    ("127.0.0.1", True, 0, None, True),
    ("::1", True, 0, None, True),
])
def test_per_key_metrics_reach_a_client_port_on_the_network_only_when_asked(
        host: str, keyed: bool, monitoring_port: int, opt_in: bool | None, served: bool) -> None:
    key = 'name = "team-a"\nsha256 = "' + "0" * 64 + '"\n'
    toml = (f"[gateway]\nmonitoring_port = {monitoring_port}\n"
            + ("" if opt_in is None else f"metrics_on_client_port = {str(opt_in).lower()}\n")
            + (f"[[gateway.keys]]\n{key}" if keyed else "") + ladder({"small": ["http://127.0.0.1:9"]}))
    assert server.client_port_metrics(decode_config(toml).gateway, host) == served


def test_run_logs_the_exposure_warning_and_serves_with_the_gateway_protocol(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    seen: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: seen.update(options))  # nothing is bound
    config = decode_config(ladder_toml("http://127.0.0.1:9") + '\n[gateway]\nshutdown_grace_s = 7.5\n')
    with caplog.at_level(logging.WARNING, logger="cascade.gateway"):
        server.run(config, None, "0.0.0.0", 8000)
    warnings = [r.getMessage() for r in caplog.records if "reachable from the network" in r.getMessage()]
    assert len(warnings) == 1
    assert seen["http"] is GatewayProtocol
    # The drain's grace ends requests (and they get 2 s for their last bytes); uvicorn's timeout is a backstop.
    assert seen["timeout_graceful_shutdown"] == 10 + 5


def test_no_exposure_warning_on_loopback(gateway: Served) -> None:
    assert "reachable from the network" not in gateway.output()
