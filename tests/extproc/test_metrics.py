"""The picker's Prometheus series move as it decides and refuses (in process), and a real `cascade extproc` serves
them, with `/health`, on its metrics port."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy_data_plane.envoy.service.ext_proc.v3 import ProcessingRequest, ProcessingResponse

from cascade.config import decode_config
from cascade.engines.supervisor import free_port
from cascade.errors import ConfigError
from cascade.extproc import metrics as extproc_metrics
from cascade.extproc.metrics import ExtprocMetrics, MetricsListener
from cascade.extproc.picker import TierPicker
from cascade.extproc.processor import SERVICE, process
from cascade.testing.processes import CASCADE
from cascade.testing.processes import process as subprocess_of
from cascade.testing.waiting import eventually, wait_http
from tests.extproc.extproc_setup import TOML, chat
from tests.extproc.test_processor import body, headers

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def value(metrics: ExtprocMetrics, name: str, **labels: str) -> float:
    sample = metrics.registry.get_sample_value(name, labels)
    assert sample is not None, (name, labels)
    return sample


def pick(p: TierPicker, raw: bytes, method: str = "POST", path: str = "/v1/chat/completions") -> None:
    asyncio.run(p.pick({":path": path, ":method": method}, raw))


def test_each_decision_counts_for_its_tier_and_its_time_is_observed() -> None:
    p = TierPicker(decode_config(TOML))
    assert value(p.metrics, "cascade_extproc_decisions_total", tier="large") == 0  # bound up front: rate() from 0
    pick(p, chat(quality="fast"))
    pick(p, chat(quality="fast"))
    pick(p, chat(quality="best"))
    assert value(p.metrics, "cascade_extproc_decisions_total", tier="small") == 2
    assert value(p.metrics, "cascade_extproc_decisions_total", tier="large") == 1
    assert value(p.metrics, "cascade_extproc_gateway_requests_total") == 0
    assert value(p.metrics, "cascade_extproc_decision_seconds_count") == 3
    assert 0 < value(p.metrics, "cascade_extproc_decision_seconds_sum") < 3 * 0.1  # sub-100 ms each, in process


def test_refusals_count_by_status_and_other_paths_count_nowhere() -> None:
    p = TierPicker(decode_config(TOML))
    pick(p, b'{"model": "cascade", "messages": [')
    pick(p, chat(quality="nonsense"))
    pick(p, chat(), method="GET")
    pick(p, b"", path="/v1/models", method="GET")  # not a chat completion: left as it is, not counted
    assert value(p.metrics, "cascade_extproc_refusals_total", status="400") == 2
    assert value(p.metrics, "cascade_extproc_refusals_total", status="405") == 1
    assert value(p.metrics, "cascade_extproc_decision_seconds_count") == 3
    assert sum(value(p.metrics, "cascade_extproc_decisions_total", tier=t) for t in ("small", "medium", "large")) == 0


def test_a_request_sent_on_to_the_gateway_counts_for_its_tier_and_the_gateway() -> None:
    p = TierPicker(decode_config(TOML), gateway=True)
    pick(p, chat(quality="best", branches={"n": 2}))
    assert value(p.metrics, "cascade_extproc_gateway_requests_total") == 1
    assert value(p.metrics, "cascade_extproc_decisions_total", tier="large") == 1


def test_a_keys_decisions_and_refusals_and_the_redis_stores_health_are_on_the_pickers_registry() -> None:
    digest = hashlib.sha256(b"csk-team").hexdigest()
    # Redis on a port nothing listens on, failing open: the key's limit is kept in this process instead.
    p = TierPicker(decode_config(f'[gateway.redis]\nurl = "redis://127.0.0.1:{free_port()}"\n'
                                 f'[[gateway.keys]]\nname = "team"\nsha256 = "{digest}"\nrequests_per_minute = 1\n'
                                 + TOML))

    async def run() -> None:
        for _ in range(2):
            await p.pick({":path": "/v1/chat/completions", ":method": "POST", "authorization": "Bearer csk-team"},
                         chat(quality="fast"))
        await p.aclose()

    asyncio.run(run())
    assert value(p.metrics, "cascade_extproc_key_decisions_total", key="team", tier="small") == 1
    assert value(p.metrics, "cascade_key_rate_limited_total", key="team", limit="requests") == 1
    assert value(p.metrics, "cascade_redis_up") == 0
    assert value(p.metrics, "cascade_redis_fail_open_total", op="acquire") == 2
    # Only those of the gateway's series: what `cascade serve` counts (requests served, tokens) is not exported here.
    names = {m.name for m in p.metrics.registry.collect()}
    assert "cascade_requests" not in names and "cascade_key_requests" not in names


def test_a_stream_is_open_while_envoy_sends_and_a_partial_body_counts_as_a_413() -> None:
    p = TierPicker(decode_config(TOML))

    async def messages() -> AsyncIterator[ProcessingRequest]:
        yield headers()
        yield body(chat()[:10], end=False)

    async def run() -> list[float]:
        seen = []
        async for _ in process(p, messages()):
            seen.append(value(p.metrics, "cascade_extproc_open_streams"))
        return seen

    assert asyncio.run(run()) == [1, 1]
    assert value(p.metrics, "cascade_extproc_open_streams") == 0
    assert value(p.metrics, "cascade_extproc_refusals_total", status="413") == 1


def get(url: str) -> tuple[int, str]:
    try:
        with _OPENER.open(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_listener_serves_metrics_and_health_and_nothing_else() -> None:
    metrics = ExtprocMetrics(["small"])
    metrics.decided("small")
    listener = MetricsListener(metrics, "127.0.0.1", 0).start()
    try:
        base = f"http://127.0.0.1:{listener.port}"
        status, text = get(f"{base}/metrics")
        assert status == 200 and 'cascade_extproc_decisions_total{tier="small"} 1.0' in text
        assert get(f"{base}/health") == (200, "ok\n")
        assert get(f"{base}/v1/models")[0] == 404
    finally:
        listener.stop()


def test_idle_connections_hold_no_thread_and_are_closed_and_a_scrape_still_gets_through(monkeypatch) -> None:
    """Connections that open and send nothing each held a thread; now one thread serves them all, at most
    MAX_CONNECTIONS at once (the rest closed on arrival), each idle one closed after IDLE_S."""
    monkeypatch.setattr(extproc_metrics, "IDLE_S", 0.5)
    monkeypatch.setattr(extproc_metrics, "MAX_CONNECTIONS", 8)
    threads_before = threading.active_count()
    listener = MetricsListener(ExtprocMetrics(["small"]), "127.0.0.1", 0).start()
    idle = []
    try:
        assert threading.active_count() == threads_before + 1
        idle = [socket.create_connection(("127.0.0.1", listener.port), timeout=5) for _ in range(40)]
        assert eventually(lambda: listener.open_connections == 8, 5)
        assert threading.active_count() == threads_before + 1
        assert idle[-1].recv(1) == b""  # past the cap: closed at once
        assert eventually(lambda: listener.open_connections == 0, 5)  # the idle ones time out
        assert idle[0].recv(1) == b""
        assert get(f"http://127.0.0.1:{listener.port}/health") == (200, "ok\n")
    finally:
        for sock in idle:
            sock.close()
        listener.stop()
    assert threading.active_count() == threads_before


def raw(port: int, data: bytes) -> bytes:
    """What the listener sends back on one connection for `data`, until it closes it."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(data)
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:  # closed with unread input
            pass
    return received


def test_requests_on_one_connection_are_answered_in_turn_and_bad_ones_close_it() -> None:
    metrics = ExtprocMetrics(["small"])
    listener = MetricsListener(metrics, "127.0.0.1", 0).start()
    try:
        two = raw(listener.port, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
                                 b"HEAD /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert two.count(b"HTTP/1.1 200 OK") == 2 and two.endswith(b"\r\n\r\n")  # HEAD: headers only
        assert raw(listener.port, b"POST /metrics HTTP/1.1\r\ncontent-length: 2\r\n\r\nhi").startswith(
            b"HTTP/1.1 400")
        assert raw(listener.port, b"DELETE /metrics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 405")
        assert raw(listener.port, b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n") == b""  # over MAX_HEAD_BYTES
        assert raw(listener.port, b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400")
        assert get(f"http://127.0.0.1:{listener.port}/metrics")[0] == 200
    finally:
        listener.stop()


def test_a_busy_metrics_port_is_a_config_error() -> None:
    metrics = ExtprocMetrics(["small"])
    first = MetricsListener(metrics, "127.0.0.1", 0).start()
    try:
        with pytest.raises(ConfigError, match="--metrics-port"):
            MetricsListener(metrics, "127.0.0.1", first.port).start()
    finally:
        first.stop()


def test_a_real_extproc_serves_metrics_and_health_on_its_metrics_port(tmp_path: Path) -> None:
    config = tmp_path / "cascade.toml"
    config.write_text(TOML)
    port, metrics_port = free_port(), free_port()
    log = tmp_path / "extproc.log"
    argv = [*CASCADE, "extproc", "--config", str(config), "--port", str(port), "--metrics-port", str(metrics_port)]
    with subprocess_of(argv, log, grace_s=5) as proc:
        base = f"http://127.0.0.1:{metrics_port}"
        wait_http(f"{base}/health", proc, log, timeout_s=60)

        async def one_request() -> list[ProcessingResponse]:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.stream_stream(f"/{SERVICE}/Process",
                                             request_serializer=ProcessingRequest.SerializeToString,
                                             response_deserializer=ProcessingResponse.FromString)
                return [r async for r in call(iter([headers(), body(chat(quality="fast"))]), timeout=10)]

        assert len(asyncio.run(one_request())) == 2
        status, text = get(f"{base}/metrics")
        assert status == 200, text
        assert 'cascade_extproc_decisions_total{tier="small"} 1.0' in text
        assert "cascade_extproc_decision_seconds_count 1.0" in text
        assert "cascade_extproc_open_streams 0.0" in text
        assert 'cascade_extproc_refusals_total{status="429"} 0.0' in text
        assert "cascade_extproc_gateway_requests_total 0.0" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, log.read_text()
