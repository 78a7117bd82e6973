"""`cascade deploy` without --dry-run: fake engines launched per replica on 127.0.0.1, supervised,
pointed at by the gateway config, and all gone after SIGTERM/SIGINT. SGLang servers bind loopback (or their
node's name, or --engine-host), and an engine API key from the environment never shows in what is printed."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cascade.config import CascadeConfig, SGLangBackendConfig, load_config
from cascade.engines.supervisor import free_port
from cascade.testing.waiting import eventually

FAKE = f"{shlex.quote(sys.executable)} -m cascade.cli fake-server --port {{port}} --model {{model}}"
PLAN = {"tiers": ["a", "b"], "operating_points": [], "gpus_per_node": 8,
        "deployment": [{"tier": "a", "gpus": 2, "replicas": 2, "tp": 1, "model": "org/a"},
                       {"tier": "b", "gpus": 2, "replicas": 1, "tp": 2, "model": "org/b"}]}


def write_plan(folder: Path, plan: dict = PLAN) -> Path:
    path = folder / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cascade.cli", *args], capture_output=True, text=True, timeout=60,
                          env=env)


def children(pid: int) -> set[int]:
    """Processes whose parent is `pid` (Linux /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def start_deploy(tmp_path: Path, plan: Path) -> tuple[subprocess.Popen[bytes], Path]:
    config = tmp_path / "gateway.toml"
    with (tmp_path / "deploy.out").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cascade.cli", "deploy", "--plan", str(plan), "--engine", "local",
             "--engine-command", FAKE, "--config-out", str(config), "--log-dir", str(tmp_path / "logs"),
             "--startup-timeout-s", "60"], stdout=out, stderr=subprocess.STDOUT)
    if not eventually(lambda: config.exists() or proc.poll() is not None, within_s=90):
        proc.kill()
        pytest.fail("deploy did not bring the engines up within 90 s")
    assert proc.poll() is None, (tmp_path / "deploy.out").read_text()
    return proc, config


def stop(proc: subprocess.Popen[bytes], sig: int) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_engines_start_answer_restart_and_leave_no_orphan_after_sigterm(tmp_path) -> None:
    proc, config_path = start_deploy(tmp_path, write_plan(tmp_path))
    try:
        config = load_config(config_path)
        backends = {t.name: [(b.url, b.model) for b in t.backends] for t in config.tiers}  # type: ignore[union-attr]
        assert [len(backends["a"]), len(backends["b"])] == [2, 1]
        for tier, model in (("a", "org/a"), ("b", "org/b")):
            for url, served in backends[tier]:
                assert served == model
                reply = httpx.get(f"{url}/v1/models", timeout=5, trust_env=False).json()
                assert reply["data"][0]["id"] == model
        engines = children(proc.pid)
        assert len(engines) == 3
        # A crashed engine comes back on its port (supervisor: restart with backoff).
        url = backends["a"][0][0]
        victim = next(pid for pid in engines if f"--port {url.rsplit(':', 1)[1]}" in
                      Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        os.kill(victim, signal.SIGKILL)
        assert eventually(lambda: not answers(url), within_s=5)
        assert eventually(lambda: answers(url), within_s=30)
        engines = children(proc.pid)
    finally:
        code = stop(proc, signal.SIGTERM)
    assert code == 0, (tmp_path / "deploy.out").read_text()
    assert all(eventually(lambda pid=pid: not Path(f"/proc/{pid}").exists(), within_s=5) for pid in engines)
    assert not any(answers(url) for urls in backends.values() for url, _ in urls)
    assert "stopping the engines" in (tmp_path / "deploy.out").read_text()


def test_ctrl_c_stops_the_engines_too(tmp_path) -> None:
    plan = dict(PLAN, tiers=["a"], deployment=[PLAN["deployment"][0] | {"replicas": 1, "gpus": 1}])
    proc, config_path = start_deploy(tmp_path, write_plan(tmp_path, plan))
    try:
        engines = children(proc.pid)
        url = load_config(config_path).tiers[0].backends[0].url  # type: ignore[union-attr]
        assert answers(url) and len(engines) == 1
    finally:
        code = stop(proc, signal.SIGINT)
    assert code == 0
    assert eventually(lambda: not any(Path(f"/proc/{pid}").exists() for pid in engines), within_s=5)
    assert not answers(url)


def test_local_dry_run_prints_one_command_per_replica_and_a_valid_gateway_config(tmp_path) -> None:
    result = run("deploy", "--plan", str(write_plan(tmp_path)), "--engine", "local", "--dry-run",
                 "--engine-command", FAKE)
    assert result.returncode == 0, result.stderr
    commands = [line for line in result.stdout.splitlines() if "fake-server" in line]
    assert len(commands) == 3 and sum("--model org/a" in c for c in commands) == 2
    config_text = result.stdout[result.stdout.index("# cascade.toml"):]
    (tmp_path / "cascade.toml").write_text(config_text)
    assert [t.name for t in load_config(tmp_path / "cascade.toml").tiers] == ["a", "b"]


def test_a_plan_with_a_tier_left_without_gpus_is_refused_in_one_line(tmp_path) -> None:
    idle = {**PLAN, "deployment": [PLAN["deployment"][0], {"tier": "b", "gpus": 0, "replicas": 0, "model": "org/b"}]}
    result = run("deploy", "--plan", str(write_plan(tmp_path, idle)), "--engine", "local", "--dry-run",
                 "--engine-command", FAKE)
    assert result.returncode == 2 and "deploy_every_tier" in result.stderr and "Traceback" not in result.stderr
    assert "tier(s) b have no GPUs" in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here")
def test_sglang_without_sglang_installed_is_one_line_and_exit_2(tmp_path) -> None:
    result = run("deploy", "--plan", str(write_plan(tmp_path)), "--engine", "sglang")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "`sglang` package is not importable" in lines[0] and "--dry-run" in lines[0]


@pytest.mark.parametrize(("args", "message"), [
    ([], "is not an embedded CPU model"),
    (["--engine-command", "no-such-engine --port {port}"], "is not an executable"),
    (["--engine-command", "cascade fake-server --port {prot}"], "bad placeholder"),
])
def test_local_launch_errors_are_one_line_and_exit_2(tmp_path, args: list[str], message: str) -> None:
    result = run("deploy", "--plan", str(write_plan(tmp_path)), "--engine", "local", *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


STUB_SGLANG = '''"""Stands in for `python -m sglang.launch_server` (never installed in tests): a fake SGLang server on
its --host (loopback only, refused otherwise) that names its model path and CUDA_VISIBLE_DEVICES as its model
id and, like SGLang, with --api-key requires `Authorization: Bearer <key>` on every route but /health, /metrics."""
import argparse
import ipaddress
import json
import os

import uvicorn

from cascade.testing.fakes.sglang import FakeSGLang
from cascade.testing.fakes.engine import FakeScript

parser = argparse.ArgumentParser()
parser.add_argument("--model-path")
parser.add_argument("--host")
parser.add_argument("--port", type=int)
parser.add_argument("--api-key", default="")
parser.add_argument("--node-rank", type=int, default=0)
args, _ = parser.parse_known_args()
if args.node_rank > 0:  # like SGLang: only rank 0 of a multi-node replica serves HTTP
    import signal
    signal.pause()
assert ipaddress.ip_address(args.host).is_loopback, f"a test engine must bind loopback, not {args.host}"
model = f"{args.model_path}@{os.environ.get('CUDA_VISIBLE_DEVICES')}"
app = FakeSGLang(FakeScript(model=model))


async def with_key(scope, receive, send):
    open_path = scope["type"] != "http" or scope["path"].startswith(("/health", "/metrics"))
    if open_path or dict(scope["headers"]).get(b"authorization") == f"Bearer {args.api_key}".encode():
        return await app(scope, receive, send)
    await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps({"error": "Unauthorized"}).encode()})


uvicorn.run(with_key if args.api_key else app, host=args.host, port=args.port, log_level="warning")
'''


def stub_sglang_env(tmp_path: Path) -> dict[str, str]:
    """An environment in which `python -m sglang.launch_server` is STUB_SGLANG."""
    stub = tmp_path / "stub" / "sglang"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text("")
    (stub / "launch_server.py").write_text(STUB_SGLANG)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(stub.parent), os.getcwd()]))


def test_sglang_servers_get_their_gpus_and_the_gateway_config_points_at_them(tmp_path) -> None:
    env = stub_sglang_env(tmp_path)
    plan = dict(PLAN, deployment=[{"tier": "a", "gpus": 2, "replicas": 2, "tp": 1, "model": "org/a"},
                                  {"tier": "b", "gpus": 2, "replicas": 1, "tp": 2, "model": "org/b"}])
    config_path = tmp_path / "gateway.toml"
    with (tmp_path / "deploy.out").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cascade.cli", "deploy", "--plan", str(write_plan(tmp_path, plan)), "--engine",
             "sglang", "--base-port", str(free_port_block(3)), "--config-out", str(config_path), "--log-dir",
             str(tmp_path / "logs"), "--startup-timeout-s", "60"], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        assert eventually(lambda: config_path.exists() or proc.poll() is not None, within_s=90)
        assert proc.poll() is None, (tmp_path / "deploy.out").read_text()
        served = {}
        for tier in load_config(config_path).tiers:
            for backend in tier.backends:
                assert isinstance(backend, SGLangBackendConfig)
                served[backend.url] = httpx.get(f"{backend.url}/v1/models", timeout=5,
                                                trust_env=False).json()["data"][0]["id"]
        # Every GPU given once: the TP2 replica takes two devices, each TP1 replica one.
        assert sorted(served.values()) == ["org/a@2", "org/a@3", "org/b@0,1"]
    finally:
        code = stop(proc, signal.SIGTERM)
    assert code == 0
    assert not any(answers(url) for url in served)


TWO_NODES = dict(PLAN, tiers=["a"], deployment=[{"tier": "a", "gpus": 16, "replicas": 1, "tp": 8, "pp": 2,
                                                "model": "org/a"}])


def test_a_plan_that_spans_nodes_starts_per_node_and_each_node_writes_the_same_config(tmp_path) -> None:
    env = stub_sglang_env(tmp_path)
    plan, base = str(write_plan(tmp_path, TWO_NODES)), free_port_block(1)
    procs = {}
    try:
        # node-b first and alone: its rank-1 server serves no HTTP, so it must count as started by
        # liveness (a /health wait would hang: nothing answers on its port yet).
        for node in ("node-b", "127.0.0.1"):
            folder = tmp_path / node
            folder.mkdir()
            with (folder / "deploy.out").open("wb") as out:
                procs[node] = proc = subprocess.Popen(
                    [sys.executable, "-m", "cascade.cli", "deploy", "--plan", plan, "--engine", "sglang", "--hosts",
                     "127.0.0.1,node-b", "--node", node, "--base-port", str(base), "--config-out",
                     str(folder / "gateway.toml"), "--log-dir", str(folder / "logs"), "--startup-timeout-s", "20"],
                    stdout=out, stderr=subprocess.STDOUT, env=env)
            config = folder / "gateway.toml"
            assert eventually(lambda c=config, p=proc: c.exists() or p.poll() is not None, within_s=60)
            assert proc.poll() is None, (folder / "deploy.out").read_text()
        texts = {(tmp_path / node / "gateway.toml").read_text() for node in procs}
        assert len(texts) == 1  # every node writes the deployment's config, not its own part
        backends = load_config(tmp_path / "127.0.0.1" / "gateway.toml").tiers[0].backends  # type: ignore[union-attr]
        assert [b.url for b in backends] == [f"http://127.0.0.1:{base}"]  # rank 0 serves; rank 1 does not
        assert answers(backends[0].url)
        ranks = {node: [Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                        for pid in children(proc.pid)] for node, proc in procs.items()}
        assert all(len(argvs) == 1 for argvs in ranks.values())
        assert "--node-rank 1" in ranks["node-b"][0] and f"--dist-init-addr 127.0.0.1:{base + 1000}" in ranks["node-b"][0]
        assert "--node-rank 0" in ranks["127.0.0.1"][0]
        # Each node's servers bind that node's own name in --hosts, never 0.0.0.0; without an API key a
        # non-loopback bind is warned about.
        assert "--host 127.0.0.1 " in ranks["127.0.0.1"][0] and "--host node-b " in ranks["node-b"][0]
        assert "warning: the SGLang engines bind node-b," in (tmp_path / "node-b" / "deploy.out").read_text()
        assert "warning:" not in (tmp_path / "127.0.0.1" / "deploy.out").read_text()
        engines = [pid for proc in procs.values() for pid in children(proc.pid)]
    finally:
        codes = [stop(proc, signal.SIGTERM) for proc in procs.values()]
    assert codes == [0, 0]
    assert eventually(lambda: not any(Path(f"/proc/{pid}").exists() for pid in engines), within_s=5)


@pytest.mark.parametrize(("args", "message"), [
    ([], "pass --hosts"),
    (["--hosts", "n0,n1"], "pass --hosts"),
    (["--hosts", "n0,n1", "--node", "n2"], "--node `n2` is not one of --hosts"),
])
def test_multi_node_launch_errors_are_one_line_and_exit_2(tmp_path, args: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "cascade.cli", "deploy", "--plan",
                             str(write_plan(tmp_path, TWO_NODES)), "--engine", "sglang", *args],
                            capture_output=True, text=True, timeout=60, env=stub_sglang_env(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


SECRET = "engine-key-7f3a9c"  # the engine API key the tests put in the environment


def without_key(env: dict[str, str] | None = None) -> dict[str, str]:
    return {k: v for k, v in (env or os.environ).items() if k != "CASCADE_ENGINE_API_KEY"}


def launch_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if "python -m sglang.launch_server" in line]


def printed_config(stdout: str, folder: Path) -> CascadeConfig:
    (folder / "printed.toml").write_text(stdout[stdout.index("# cascade.toml"):])
    return load_config(folder / "printed.toml")


def test_sglang_dry_run_of_a_one_node_plan_binds_loopback_and_warns_about_nothing(tmp_path) -> None:
    result = run("deploy", "--plan", str(write_plan(tmp_path)), "--engine", "sglang", "--dry-run", env=without_key())
    assert result.returncode == 0, result.stderr
    commands = launch_lines(result.stdout)
    assert len(commands) == 3 and all("--host 127.0.0.1 " in c and "--api-key" not in c for c in commands)
    assert "0.0.0.0" not in result.stdout and result.stderr == ""
    backends = [b for t in printed_config(result.stdout, tmp_path).tiers for b in t.backends]
    assert all(b.url.startswith("http://127.0.0.1:") and not b.api_key for b in backends)  # type: ignore[union-attr]


def test_sglang_dry_run_across_nodes_binds_each_nodes_host_and_warns_without_a_key(tmp_path) -> None:
    result = run("deploy", "--plan", str(write_plan(tmp_path, TWO_NODES)), "--engine", "sglang", "--dry-run",
                 "--hosts", "gpu-a,gpu-b", env=without_key())
    assert result.returncode == 0, result.stderr
    commands = launch_lines(result.stdout)
    assert len(commands) == 2 and "--host gpu-a " in commands[0] and "--host gpu-b " in commands[1]
    assert 'url = "http://gpu-a:30000"' in result.stdout
    assert result.stderr.startswith("warning: the SGLang engines bind gpu-a, gpu-b, reachable from the network")
    assert len(result.stderr.strip().splitlines()) == 1 and "CASCADE_ENGINE_API_KEY" in result.stderr


def test_engine_host_0_0_0_0_is_honoured_and_warned_about_without_a_key(tmp_path) -> None:
    result = run("deploy", "--plan", str(write_plan(tmp_path)), "--engine", "sglang", "--dry-run", "--engine-host",
                 "0.0.0.0", env=without_key())
    assert result.returncode == 0, result.stderr
    assert [c.count("--host 0.0.0.0 ") for c in launch_lines(result.stdout)] == [1, 1, 1]
    # The gateway config points where this node reaches the engines, not at the wildcard.
    backends = [b for t in printed_config(result.stdout, tmp_path).tiers for b in t.backends]
    assert all(b.url.startswith("http://127.0.0.1:") for b in backends)  # type: ignore[union-attr]
    assert len(result.stderr.strip().splitlines()) == 1 and "bind 0.0.0.0, reachable" in result.stderr


@pytest.mark.parametrize("variable", ["CASCADE_ENGINE_API_KEY", "MY_ENGINE_KEY"])
def test_with_the_key_in_the_environment_the_dry_run_names_the_variable_never_the_value(tmp_path,
                                                                                        variable: str) -> None:
    option = [] if variable == "CASCADE_ENGINE_API_KEY" else ["--engine-api-key-env", variable]
    result = run("deploy", "--plan", str(write_plan(tmp_path)), "--engine", "sglang", "--dry-run", "--engine-host",
                 "0.0.0.0", *option, env={**without_key(), variable: SECRET})
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout and SECRET not in result.stderr
    assert [c.count(f'--api-key "${variable}"') for c in launch_lines(result.stdout)] == [1, 1, 1]
    backends = [b for t in printed_config(result.stdout, tmp_path).tiers for b in t.backends]
    assert {b.api_key for b in backends} == {f"${{{variable}}}"}  # type: ignore[union-attr]
    assert result.stderr == ""  # bound to every interface, but with a key: no warning


def start_sglang_deploy(tmp_path: Path, env: dict[str, str], *extra: str,
                        model: str = "org/a") -> tuple[subprocess.Popen[bytes], Path]:
    plan = dict(PLAN, tiers=["a"], deployment=[{"tier": "a", "gpus": 1, "replicas": 1, "tp": 1, "model": model}])
    config = tmp_path / "gateway.toml"
    with (tmp_path / "deploy.out").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cascade.cli", "deploy", "--plan", str(write_plan(tmp_path, plan)), "--engine",
             "sglang", "--base-port", str(free_port_block(1)), "--config-out", str(config), "--log-dir",
             str(tmp_path / "logs"), "--startup-timeout-s", "60", *extra], stdout=out, stderr=subprocess.STDOUT,
            env=env)
    if not eventually(lambda: config.exists() or proc.poll() is not None, within_s=90):
        proc.kill()
        pytest.fail("deploy did not bring the engines up within 90 s")
    assert proc.poll() is None, (tmp_path / "deploy.out").read_text()
    return proc, config


def test_with_the_key_in_the_environment_engines_require_it_and_only_the_private_config_holds_it(tmp_path) -> None:
    proc, config_path = start_sglang_deploy(tmp_path, {**without_key(stub_sglang_env(tmp_path)),
                                                       "CASCADE_ENGINE_API_KEY": SECRET})
    try:
        backend = load_config(config_path).tiers[0].backends[0]
        assert isinstance(backend, SGLangBackendConfig) and backend.api_key == SECRET
        # The config and the engine logs (SGLang logs its arguments) are the owner's only.
        assert [p.stat().st_mode & 0o777 for p in (config_path, tmp_path / "logs" / "a-0.log")] == [0o600, 0o600]
        assert backend.url.startswith("http://127.0.0.1:")
        refused = httpx.get(f"{backend.url}/v1/models", timeout=5, trust_env=False)
        served = httpx.get(f"{backend.url}/v1/models", headers={"Authorization": f"Bearer {SECRET}"}, timeout=5,
                           trust_env=False)
        assert (refused.status_code, served.status_code) == (401, 200)
        (argv,) = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in children(proc.pid)]
        assert argv[argv.index(b"--api-key") + 1] == SECRET.encode()
        assert argv[argv.index(b"--host") + 1] == b"127.0.0.1"
    finally:
        code = stop(proc, signal.SIGTERM)
    assert code == 0
    out = (tmp_path / "deploy.out").read_text()
    assert SECRET not in out and "holds the engine API key; mode 0600" in out and "warning:" not in out


def test_an_engine_host_is_where_the_engines_are_health_checked_and_the_config_points(tmp_path) -> None:
    # 127.0.0.2: an address other than 127.0.0.1 that still never leaves this machine (Linux loopback is /8).
    proc, config_path = start_sglang_deploy(tmp_path, without_key(stub_sglang_env(tmp_path)), "--engine-host",
                                            "127.0.0.2")
    try:
        url = load_config(config_path).tiers[0].backends[0].url  # type: ignore[union-attr]
        assert url.startswith("http://127.0.0.2:") and answers(url)
    finally:
        code = stop(proc, signal.SIGTERM)
    assert code == 0 and "warning:" not in (tmp_path / "deploy.out").read_text()


def test_a_reasoning_models_engine_is_launched_with_its_cards_parser_and_deterministic_when_asked(tmp_path) -> None:
    proc, _ = start_sglang_deploy(tmp_path, without_key(stub_sglang_env(tmp_path)), "--deterministic",
                                  model="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")
    try:
        (argv,) = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in children(proc.pid)]
        assert argv[argv.index(b"--reasoning-parser") + 1] == b"deepseek-r1"
        assert b"--enable-deterministic-inference" in argv and b"--tool-call-parser" not in argv
    finally:
        code = stop(proc, signal.SIGTERM)
    assert code == 0


OUTPUT_PLAN = dict(PLAN, tiers=["r1", "llama", "other"], deployment=[
    {"tier": "r1", "gpus": 1, "replicas": 1, "model": "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "deterministic": True},
    {"tier": "llama", "gpus": 1, "replicas": 1, "model": "meta-llama/Llama-3.1-8B-Instruct"},
    {"tier": "other", "gpus": 1, "replicas": 1, "model": "org/other"}])


def test_sglang_dry_run_shows_each_tiers_parsers_and_deterministic_inference_where_asked(tmp_path) -> None:
    result = run("deploy", "--plan", str(write_plan(tmp_path, OUTPUT_PLAN)), "--engine", "sglang", "--dry-run",
                 env=without_key())
    assert result.returncode == 0, result.stderr
    r1, llama, other = (next(c for c in launch_lines(result.stdout) if c.endswith(f"# tier {t}"))
                        for t in ("r1", "llama", "other"))
    assert "--reasoning-parser deepseek-r1 --enable-deterministic-inference " in r1 and "--tool-call-parser" not in r1
    assert "--tool-call-parser llama3 " in llama and "--reasoning-parser" not in llama
    assert "--enable-deterministic-inference" not in llama  # only the tier the plan marks
    assert not any(f in other for f in ("--reasoning-parser", "--tool-call-parser", "--enable-deterministic-inference"))
    everywhere = run("deploy", "--plan", str(write_plan(tmp_path, OUTPUT_PLAN)), "--engine", "sglang", "--dry-run",
                     "--deterministic", env=without_key())
    assert [c.count("--enable-deterministic-inference") for c in launch_lines(everywhere.stdout)] == [1, 1, 1]


@pytest.mark.parametrize(("deployment", "args", "message"), [
    ({"reasoning_parser": "r1"}, ["--engine", "sglang", "--dry-run"], "reasoning_parser `r1` is not one SGLang"),
    ({"tool_call_parser": "llama-3"}, ["--engine", "sglang", "--dry-run"], "use one of: apertus2509"),
    ({}, ["--engine", "local", "--deterministic", "--engine-command", FAKE], "--deterministic applies to --engine sglang"),
])
def test_output_settings_errors_are_one_line_and_exit_2(tmp_path, deployment: dict, args: list[str],
                                                        message: str) -> None:
    plan = dict(PLAN, tiers=["a"], deployment=[{"tier": "a", "gpus": 1, "replicas": 1, "model": "org/a", **deployment}])
    result = run("deploy", "--plan", str(write_plan(tmp_path, plan)), *args, env=without_key())
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def free_port_block(n: int) -> int:
    """A port p with p .. p+n-1 free now (SGLang servers take consecutive ports from --base-port)."""
    for _ in range(50):
        base = free_port()
        with contextlib.ExitStack() as held:
            try:
                for k in range(n):
                    held.enter_context(socket.create_server(("127.0.0.1", base + k)))
            except OSError:
                continue
        return base
    raise RuntimeError("no block of free ports")
