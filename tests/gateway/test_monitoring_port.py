"""`[gateway] monitoring_port` (cascade/gateway/monitoring.py): /metrics and /ready's detail on a port of their own,
started and stopped with the gateway; the main port's /metrics is then a 404 and its /ready the status alone, with the
same code. And an engine's address never reaches a client in an error body.

Every server binds 127.0.0.1 and stops when its block exits.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from cascade.branches.backend import GenerationRequest, collect
from cascade.branches.openai_client import OpenAIBackend
from cascade.branches.prm_client import SGLangPRMScorer
from cascade.config import PRMScorerConfig, decode_config
from cascade.deploy import kube
from cascade.engines.supervisor import free_port
from cascade.errors import BackendUnavailable, ConfigError
from cascade.gateway.server import Gateway
from cascade.schemas import ChatMessage
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.processes import CASCADE, process, run
from cascade.testing.waiting import eventually, wait_http
from tests.gateway.gateway_setup import post_chat, user
from tests.gateway.test_failover import ladder, servers

# Probes every 0.1 s, each cut at 0.3 s, one failure marks an engine down (as in test_readiness.py).
HEALTH = "[gateway.health]\ninterval_s = 0.1\ntimeout_s = 0.3\nunhealthy_after = 1\n"


@contextmanager
def monitored(toml: str) -> Iterator[tuple[str, str]]:
    """A gateway with a monitoring port: (its base URL, its monitoring port's base URL)."""
    port = free_port()
    gateway = Gateway(decode_config(f"[gateway]\nmonitoring_port = {port}\n{toml}"))
    with serve_asgi(gateway.app, lifespan="on") as url:
        yield url, f"http://127.0.0.1:{port}"


def test_the_monitoring_port_serves_metrics_and_the_ready_detail_and_the_main_port_the_status_alone() -> None:
    hung = FakeEngine(FakeScript(tokens=4), stalled=True)
    with servers(FakeEngine(FakeScript(tokens=4)), hung) as [good, stalled], \
            monitored(ladder({"small": [good], "large": [stalled]}, HEALTH)) as (base, monitoring):
        assert eventually(lambda: httpx.get(f"{monitoring}/ready", timeout=1).json()["status"] == "degraded", 5)
        detail = httpx.get(f"{monitoring}/ready", timeout=1)
        status = httpx.get(f"{base}/ready", timeout=1)
        metrics = httpx.get(f"{monitoring}/metrics", timeout=1)
        hidden = httpx.get(f"{base}/metrics", timeout=1)
        unknown = httpx.get(f"{monitoring}/v1/models", timeout=1)
        posted = httpx.post(f"{monitoring}/metrics", timeout=1)
        served = post_chat(base, {"model": "small", "messages": user()})
        health = httpx.get(f"{base}/health", timeout=1)
        documented = httpx.get(f"{base}/openapi.json", timeout=1).json()["paths"]
    assert detail.status_code == 200 and detail.json()["tiers"] == {"small": True, "large": False}
    assert detail.json()["unhealthy"] == {"tiers": ["large"], "replicas": ["large/0"]}
    assert status.status_code == 200 and status.json() == {"status": "degraded"}
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert 'cascade_replica_health_state{replica="large/0",tier="large"}' in metrics.text
    assert hidden.status_code == 404 and set(hidden.json()["error"]) == {"message", "type", "param", "code"}
    assert unknown.status_code == 404 and "no route" in unknown.json()["error"]["message"]
    assert posted.status_code == 405 and posted.headers["allow"] == "GET, HEAD"
    assert served.status_code == 200 and health.json() == {"status": "ok"}
    assert "/metrics" not in documented and "/ready" in documented  # the document describes this port


def test_with_no_tier_able_to_serve_both_ports_answer_503_and_the_port_closes_with_the_gateway() -> None:
    engine = FakeEngine(FakeScript(tokens=4), stalled=True)
    with servers(engine) as [url], monitored(ladder({"small": [url]}, HEALTH)) as (base, monitoring):
        assert eventually(lambda: httpx.get(f"{base}/ready", timeout=1).status_code == 503, 5)
        status = httpx.get(f"{base}/ready", timeout=1)
        detail = httpx.get(f"{monitoring}/ready", timeout=1)
    assert status.json() == {"status": "unavailable"}
    assert detail.status_code == 503 and detail.json()["unhealthy"]["tiers"] == ["small"]
    with pytest.raises(httpx.ConnectError):  # stopped with the gateway
        httpx.get(f"{monitoring}/ready", timeout=1)


def test_without_a_monitoring_port_the_main_port_serves_both() -> None:
    with servers(FakeEngine(FakeScript(tokens=4))) as [url], \
            serve_asgi(Gateway(decode_config(ladder({"small": [url]}))).app, lifespan="on") as base:
        ready, metrics = httpx.get(f"{base}/ready", timeout=1), httpx.get(f"{base}/metrics", timeout=1)
    assert ready.json()["tiers"] == {"small": True} and metrics.status_code == 200
    assert decode_config(ladder({"small": [url]})).gateway.monitoring_port == 0  # off by default


def test_a_keyed_gateway_on_the_network_answers_metrics_on_the_client_port_with_a_404_that_says_what_to_set() -> None:
    key = '[[gateway.keys]]\nname = "team-a"\nsha256 = "' + "0" * 64 + '"\n'
    with servers(FakeEngine(FakeScript(tokens=4))) as [url]:
        for opt_in, code in (("", 404), ("metrics_on_client_port = true\n", 200)):
            config = decode_config(f"[gateway]\n{opt_in}{key}{ladder({'small': [url]})}")
            with serve_asgi(Gateway(config, host="0.0.0.0").app, lifespan="on") as base:
                metrics = httpx.get(f"{base}/metrics", timeout=1)
                spec = httpx.get(f"{base}/openapi.json", timeout=1).json()
            assert metrics.status_code == code and ("/metrics" in spec["paths"]) == (code == 200)
            if code == 404:
                assert "monitoring_port" in metrics.json()["error"]["message"]


@pytest.mark.parametrize("port", [-1, 65536])
def test_a_monitoring_port_outside_0_to_65535_is_a_config_error(port: int) -> None:
    with pytest.raises(ConfigError, match="monitoring_port"):
        decode_config(f"[gateway]\nmonitoring_port = {port}\n" + ladder({"small": ["http://127.0.0.1:9"]}))


def test_cascade_serve_takes_the_flag_and_refuses_the_main_port_or_a_port_in_use(tmp_path: Path) -> None:
    config = tmp_path / "cascade.toml"
    config.write_text(ladder({"small": ["http://127.0.0.1:9"]}, "[gateway.health]\nenabled = false\n"))
    port, monitoring = free_port(), free_port()
    serve = [*CASCADE, "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    same = run([*serve, "--monitoring-port", str(port)], timeout_s=60)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        in_use = run([*serve, "--monitoring-port", str(taken.getsockname()[1])], timeout_s=60)
    assert same.returncode != 0 and b"is the gateway's port" in same.stderr
    assert in_use.returncode != 0 and b"monitoring_port" in in_use.stderr and b"Traceback" not in in_use.stderr
    log = tmp_path / "serve.log"
    with process([*serve, "--monitoring-port", str(monitoring)], log) as proc:
        wait_http(f"http://127.0.0.1:{monitoring}/metrics", proc, log, 60)
        hidden = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    assert hidden.status_code == 404


def test_deploys_manifests_scrape_the_monitoring_port_and_probe_the_main_port() -> None:
    pod = kube.manifests(kube.Gateways(replicas=2, image="cascade:1", max_replicas=4))["deployment"]
    template = pod["spec"]["template"]  # type: ignore[index]
    container = template["spec"]["containers"][0]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(kube.MONITORING_PORT)
    assert container["args"][-2:] == ["--monitoring-port", str(kube.MONITORING_PORT)]
    assert {"name": "monitoring", "containerPort": kube.MONITORING_PORT} in container["ports"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}


# --- error bodies name the replica, never its address -------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_dead_engines_error_body_names_the_replica_not_its_address(
        stream: bool, caplog: pytest.LogCaptureFixture) -> None:
    dead = free_port()  # nothing listens there
    toml = ladder({"small": [f"http://127.0.0.1:{dead}"]}, "[gateway.health]\nenabled = false\n")
    with caplog.at_level(logging.WARNING, logger="cascade.backend"), \
            serve_asgi(Gateway(decode_config(toml)).app, lifespan="on") as base:
        answer = post_chat(base, {"model": "small", "messages": user(), "stream": stream})
    assert answer.status_code in (502, 503), answer.text
    assert "127.0.0.1" not in answer.text and str(dead) not in answer.text
    assert "`small/0`" in answer.json()["error"]["message"]
    assert f"127.0.0.1:{dead}" in caplog.text  # the operator's log has it


def test_backend_errors_for_clients_carry_no_url() -> None:
    dead = free_port()
    backend = OpenAIBackend("small/2", f"http://user:pw@127.0.0.1:{dead}", "m")
    scorer = SGLangPRMScorer.from_config(PRMScorerConfig(url=f"http://127.0.0.1:{dead}", model="prm"), name="small/prm")
    request = GenerationRequest(messages=[ChatMessage(role="user", content="hi")], max_tokens=4)

    async def errors() -> list[BackendUnavailable]:
        caught = []
        try:
            for attempt in (lambda: collect(backend.stream(request)), lambda: backend.request("GET", "/health"),
                            lambda: scorer.score("question", ["step"])):
                with pytest.raises(BackendUnavailable) as info:
                    await attempt()
                caught.append(info.value)
        finally:
            await backend.aclose()
            await scorer.aclose()
        return caught

    caught = asyncio.run(errors())
    for error in caught:
        assert "127.0.0.1" not in error.message and str(dead) not in error.message and "pw" not in error.message
    assert "`small/2` is unreachable" in caught[0].message and "`small/prm` is unreachable" in caught[2].message
