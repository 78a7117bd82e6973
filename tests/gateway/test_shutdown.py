"""SIGTERM/SIGINT drain of a real `cascade serve` (cascade/gateway/drain.py) in front of a real fake engine:
requests in flight finish within the grace, what outlives it ends with an OpenAI error, new requests get
503, the upstream streams are closed and the process exits in bounded time."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cascade.config import decode_config
from cascade.errors import ConfigError
from cascade.testing.servers import Served, cascade_serve, fake_engine, ladder_toml
from cascade.testing.waiting import eventually
from tests.gateway.gateway_setup import user

GRACE_S = 2.0
EXIT_BOUND_S = GRACE_S + 8.0  # the grace, the ended requests' last bytes, uvicorn's and the app's shutdown
DRAINING = f"[gateway]\nshutdown_grace_s = {GRACE_S}\n"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with fake_engine(tmp_path_factory.mktemp("engine")) as url:
        yield url


@pytest.fixture
def gateway(engine: str, tmp_path: Path) -> Iterator[Served]:
    with cascade_serve(tmp_path, engine, DRAINING) as served:
        yield served


def engine_stats(engine: str) -> dict:
    return httpx.get(f"{engine}/fake/stats", timeout=5, trust_env=False).json()


def stream_body(text: str) -> dict:
    return {"model": "tier-small", "messages": user(text), "stream": True, "max_tokens": 10_000}


def events(lines: list[str]) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


def listening(served: Served) -> bool:
    try:
        socket.create_connection(("127.0.0.1", served.port), timeout=1).close()
    except ConnectionRefusedError:
        return False
    return True


def assert_clean_exit(served: Served) -> None:
    served.wait_exit(EXIT_BOUND_S)
    output = served.output()
    assert "Traceback" not in output and "Exception in ASGI application" not in output, output


def test_a_stream_that_finishes_within_the_grace_completes_normally(gateway: Served, engine: str) -> None:
    before = engine_stats(engine)
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=stream_body("[fake tokens=10 itl_ms=100]"),
                      timeout=10, trust_env=False) as response:
        lines = response.iter_lines()
        received = [next(lines)]
        gateway.stop(signal.SIGTERM)
        received += list(lines)
    data = events(received)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert not any("error" in c for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]).split() == [
        f"t{i}" for i in range(10)]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert_clean_exit(gateway)
    assert engine_stats(engine)["streams_finished"] == before["streams_finished"] + 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stream_that_outlives_the_grace_ends_with_an_error_event_and_done(
    gateway: Served, engine: str, sig: int,
) -> None:
    before = engine_stats(engine)
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=stream_body("[fake tokens=5000 itl_ms=20]"),
                      timeout=EXIT_BOUND_S, trust_env=False) as response:
        lines = response.iter_lines()
        for _ in range(3):
            next(lines)
        gateway.stop(sig)
        data = events(list(lines))
    assert data[-1] == "[DONE]"
    assert len(data) > 10, "the stream did not go on during the grace"
    error = json.loads(data[-2])["error"]
    assert error["type"] == "server_error" and error["code"] == "shutting_down"
    assert "shutting down" in error["message"]
    assert not any("error" in json.loads(d) for d in data[:-2])
    assert_clean_exit(gateway)
    # The upstream stream was closed: the engine stopped generating.
    assert eventually(lambda: engine_stats(engine)["streams_cancelled"] == before["streams_cancelled"] + 1)
    assert engine_stats(engine)["in_flight"] == 0


def test_a_responses_stream_that_outlives_the_grace_ends_with_error_and_response_failed(
    gateway: Served, engine: str,
) -> None:
    before = engine_stats(engine)
    body = {"model": "tier-small", "input": "[fake tokens=5000 itl_ms=20]", "stream": True, "max_output_tokens": 10_000}
    with httpx.stream("POST", f"{gateway.url}/v1/responses", json=body, timeout=EXIT_BOUND_S,
                      trust_env=False) as response:
        lines = response.iter_lines()
        for _ in range(8):  # created, in_progress, the message's item and part, a delta: as event/data pairs
            next(lines)
        gateway.stop(signal.SIGTERM)
        data = [json.loads(d) for d in events(list(lines))]
    assert [d["type"] for d in data[-2:]] == ["error", "response.failed"]
    assert data[-2]["code"] == "shutting_down" and "shutting down" in data[-2]["message"]
    assert data[-1]["response"]["status"] == "failed" and data[-1]["response"]["error"]["code"] == "server_error"
    sequence = [d["sequence_number"] for d in data]
    assert sequence == list(range(sequence[0], sequence[0] + len(data))) and len(data) > 10
    assert_clean_exit(gateway)
    assert eventually(lambda: engine_stats(engine)["streams_cancelled"] == before["streams_cancelled"] + 1)


def test_a_non_streamed_request_that_outlives_the_grace_gets_a_503_error_object(gateway: Served, engine: str) -> None:
    before = engine_stats(engine)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{gateway.url}/v1/chat/completions", timeout=EXIT_BOUND_S,
                              json={"model": "tier-small", "messages": user("[fake ttft_ms=60000]")}, trust_env=False)
        assert eventually(lambda: engine_stats(engine)["in_flight"] == 1, within_s=5)
        gateway.stop(signal.SIGTERM)
        response = pending.result(timeout=EXIT_BOUND_S)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "shutting_down")
    assert_clean_exit(gateway)
    assert eventually(lambda: engine_stats(engine)["in_flight"] == 0)
    # Non-streamed requests are streamed upstream too (ChatService.complete).
    assert engine_stats(engine)["streams_cancelled"] == before["streams_cancelled"] + 1


def test_while_draining_ready_and_new_requests_get_503_and_new_connections_are_refused(
    gateway: Served, engine: str,
) -> None:
    readiness = httpx.Client(base_url=gateway.url, timeout=5, trust_env=False)
    chat = httpx.Client(base_url=gateway.url, timeout=5, trust_env=False)
    try:
        for client in (readiness, chat):  # open keep-alive connections before the signal
            assert client.get("/health").status_code == 200
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=stream_body("[fake tokens=5000 itl_ms=20]"),
                          timeout=EXIT_BOUND_S, trust_env=False) as response:
            lines = response.iter_lines()
            next(lines)
            gateway.stop(signal.SIGTERM)
            assert eventually(lambda: not listening(gateway), within_s=5), "still accepting connections"
            ready = readiness.get("/ready")
            assert ready.status_code == 503 and ready.json()["status"] == "draining"
            assert ready.headers["retry-after"] == "1"
            refused = chat.post("/v1/chat/completions", json={"model": "tier-small", "messages": user()})
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "shutting_down"
            assert events(list(lines))[-1] == "[DONE]"
    finally:
        readiness.close()
        chat.close()
    assert_clean_exit(gateway)


def test_an_idle_gateway_exits_without_waiting_for_the_grace(engine: str, tmp_path: Path) -> None:
    with cascade_serve(tmp_path, engine, "[gateway]\nshutdown_grace_s = 60\nshutdown_linger_s = 0\n") as gateway:
        with httpx.Client(base_url=gateway.url, trust_env=False) as client:  # an idle keep-alive connection
            assert client.get("/health").status_code == 200
            gateway.stop(signal.SIGTERM)
            assert gateway.wait_exit(30) < 30
        assert gateway.proc.returncode == 0
        assert "Traceback" not in gateway.output()


LINGERING = "[gateway]\nshutdown_grace_s = 60\nshutdown_linger_s = 60\n"


def test_a_pooled_idle_connection_stays_open_and_a_request_on_it_gets_the_draining_503(
    engine: str, tmp_path: Path,
) -> None:
    """A load balancer's pooled connection is not closed under it (a request it is writing would be lost, and it
    cannot know whether it was served): the request gets a 503 that says so, and once that connection closed,
    the gateway exits without waiting out its linger."""
    with cascade_serve(tmp_path, engine, LINGERING) as gateway, \
            httpx.Client(base_url=gateway.url, timeout=5, trust_env=False) as pool:
        assert pool.get("/health").status_code == 200  # one keep-alive connection, idle at the signal
        gateway.stop(signal.SIGTERM)
        assert eventually(lambda: not listening(gateway), within_s=5), "still accepting connections"
        with pytest.raises(AssertionError, match="did not exit"):
            gateway.wait_exit(1.0)  # lingering for the pooled connection
        refused = pool.post("/v1/chat/completions", json={"model": "tier-small", "messages": user()})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert refused.headers["connection"] == "close" and refused.headers["retry-after"] == "1"
        assert refused.headers["x-envoy-immediate-health-check-fail"] == "true"  # Envoy takes it out at once
        assert gateway.wait_exit(30) < 30  # its last connection closed: no need to linger on
    assert gateway.proc.returncode == 0 and "Traceback" not in gateway.output()


def test_a_response_under_way_at_the_signal_keeps_its_connection_for_the_drains_503(tmp_path: Path) -> None:
    """A response whose headers went out before the signal promised keep-alive: closing its connection when it
    completes would race a load balancer that reuses the connection at once (the request it writes is reset
    before any answer, and it cannot retry what may have been served; the scale-out soak caught one). So that
    connection stays open like an idle one, and the next request on it gets the drain's 503, which a balancer
    retries elsewhere."""
    with fake_engine(tmp_path, "--itl-ms", "20") as slow, cascade_serve(tmp_path, slow, LINGERING) as gateway, \
            httpx.Client(base_url=gateway.url, timeout=10, trust_env=False) as pool:
        body = {"model": "tier-small", "messages": user(), "stream": True, "max_tokens": 40}
        with pool.stream("POST", "/v1/chat/completions", json=body) as stream:
            assert stream.status_code == 200 and "close" not in stream.headers.get("connection", "")
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")  # under way
            gateway.stop(signal.SIGTERM)
            assert eventually(lambda: not listening(gateway), within_s=5), "still accepting connections"
            assert events(list(lines))[-1] == "[DONE]"  # it finished within the grace
        refused = pool.post("/v1/chat/completions", json={"model": "tier-small", "messages": user()})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert refused.headers["connection"] == "close"
        assert gateway.wait_exit(30) < 30
    assert gateway.proc.returncode == 0 and "Traceback" not in gateway.output()


def test_a_lingering_gateway_exits_once_its_clients_close_their_idle_connections(engine: str, tmp_path: Path) -> None:
    with cascade_serve(tmp_path, engine, LINGERING) as gateway:
        with httpx.Client(base_url=gateway.url, timeout=5, trust_env=False) as pool:
            assert pool.get("/health").status_code == 200
            gateway.stop(signal.SIGTERM)
            assert eventually(lambda: not listening(gateway), within_s=5), "still accepting connections"
            with pytest.raises(AssertionError, match="did not exit"):
                gateway.wait_exit(1.0)  # lingering for its client
        assert gateway.wait_exit(30) < 30  # closed by its client (as Envoy does once the gateway fails its check)
    assert gateway.proc.returncode == 0 and "Traceback" not in gateway.output()


@pytest.mark.parametrize("linger", ["-1", "301"])
def test_a_linger_outside_0_to_300_s_is_one_config_error_naming_the_key(linger: str) -> None:
    with pytest.raises(ConfigError, match="shutdown_linger_s"):
        decode_config(ladder_toml("http://127.0.0.1:9", f"[gateway]\nshutdown_linger_s = {linger}\n"))
    assert decode_config(ladder_toml("http://127.0.0.1:9")).gateway.shutdown_linger_s == 5.0  # the default


def test_an_idle_ctrl_c_stops_at_once_and_says_so(engine: str, tmp_path: Path) -> None:
    with cascade_serve(tmp_path, engine) as gateway:  # default grace (30 s) and linger (5 s)
        assert httpx.get(f"{gateway.url}/health", trust_env=False, timeout=5).status_code == 200  # closed after
        gateway.stop(signal.SIGINT)
        assert gateway.wait_exit(30) < 4.0  # neither the grace nor the linger is waited for
        assert gateway.proc.returncode == 0
        output = gateway.output()
        assert output.rstrip().endswith("cascade.gateway: stopped"), output


def test_an_idle_drain_says_it_waits_for_no_request(engine: str, tmp_path: Path) -> None:
    with cascade_serve(tmp_path, engine, "[gateway]\nshutdown_linger_s = 0\n") as gateway:
        with httpx.Client(base_url=gateway.url, trust_env=False) as client:  # open: the drain runs
            assert client.get("/health").status_code == 200
            gateway.stop(signal.SIGINT)
            assert gateway.wait_exit(30) < 4.0
        assert "no request in flight, stopping now" in gateway.output()
