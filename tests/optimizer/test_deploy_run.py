"""`cascade deploy` without --dry-run: fake engines launched per replica on 127.0.0.1, supervised,
pointed at by the gateway config, and all gone after SIGTERM/SIGINT."""

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

from cascade.config import SGLangBackend, load_config
from cascade.engines.supervisor import free_port
from tests.servers import eventually

FAKE = f"{shlex.quote(sys.executable)} -m cascade.cli fake-server --port {{port}} --model {{model}}"
PLAN = {"tiers": ["a", "b"], "operating_points": [], "gpus_per_node": 8,
        "deployment": [{"tier": "a", "gpus": 2, "replicas": 2, "tp": 1, "model": "org/a"},
                       {"tier": "b", "gpus": 2, "replicas": 1, "tp": 2, "model": "org/b"}]}


def write_plan(folder: Path, plan: dict = PLAN) -> Path:
    path = folder / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cascade.cli", *args], capture_output=True, text=True, timeout=60)


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
127.0.0.1 that names its model path and CUDA_VISIBLE_DEVICES as its model id."""
import argparse
import os

import uvicorn

from cascade.engines.fake_sglang import FakeSGLang
from cascade.engines.fake_server import FakeScript

parser = argparse.ArgumentParser()
parser.add_argument("--model-path")
parser.add_argument("--port", type=int)
args, _ = parser.parse_known_args()
model = f"{args.model_path}@{os.environ.get('CUDA_VISIBLE_DEVICES')}"
uvicorn.run(FakeSGLang(FakeScript(model=model)), host="127.0.0.1", port=args.port, log_level="warning")
'''


def test_sglang_servers_get_their_gpus_and_the_gateway_config_points_at_them(tmp_path) -> None:
    stub = tmp_path / "stub" / "sglang"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    (stub / "launch_server.py").write_text(STUB_SGLANG)
    plan = dict(PLAN, deployment=[{"tier": "a", "gpus": 2, "replicas": 2, "tp": 1, "model": "org/a"},
                                  {"tier": "b", "gpus": 2, "replicas": 1, "tp": 2, "model": "org/b"}])
    config_path = tmp_path / "gateway.toml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(stub.parent), os.getcwd()]))
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
                assert isinstance(backend, SGLangBackend)
                served[backend.url] = httpx.get(f"{backend.url}/v1/models", timeout=5,
                                                trust_env=False).json()["data"][0]["id"]
        # Every GPU given once: the TP2 replica takes two devices, each TP1 replica one.
        assert sorted(served.values()) == ["org/a@2", "org/a@3", "org/b@0,1"]
    finally:
        code = stop(proc, signal.SIGTERM)
    assert code == 0
    assert not any(answers(url) for url in served)


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
