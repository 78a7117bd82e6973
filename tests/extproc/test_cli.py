"""`cascade extproc`: its mistakes are one-line errors (exit 2), `--print-envoy` prints a bootstrap and exits, and
the server stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cascade.cli import main
from cascade.engines.supervisor import free_port
from cascade.testing.processes import CASCADE, process
from tests.extproc.extproc_setup import TOML, wait_port


def test_help_explains_the_command_and_imports_neither_the_gateway_nor_grpc() -> None:
    heavy = ("litestar", "grpc", "envoy_data_plane", "sklearn", "torch")
    probe = ("import sys\nfrom cascade.cli import main\n"
             "try:\n    main(['extproc', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
             f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "x-cascade-tier" in result.stdout and "--print-envoy" in result.stdout and "--metrics-port" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "cascade.toml"
    path.write_text(TOML)
    return path


def test_print_envoy_writes_one_cluster_per_tier_and_the_processors_address(
        config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["extproc", "--config", str(config), "--host", "0.0.0.0", "--port", "9100", "--print-envoy"]) == 0
    document = json.loads(capsys.readouterr().out)
    clusters = {c["name"]: c for c in document["static_resources"]["clusters"]}
    assert set(clusters) == {"cascade_extproc", "cascade_tier_0", "cascade_tier_1", "cascade_tier_2"}
    address = clusters["cascade_extproc"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert address["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9100}


@pytest.mark.parametrize(("flags", "message"), [
    (["--print-envoy", "--listen", "8080"], "--listen '8080': expected HOST:PORT"),
    (["--gateway", "gateway:http"], "--gateway 'gateway:http': expected HOST:PORT"),
    (["--print-envoy", "--message-timeout-ms", "0"], "--message-timeout-ms"),
    (["--port", "9100", "--metrics-port", "9100"], "--metrics-port 9100 is the gRPC --port"),
    (["--metrics-port", "70000"], "--metrics-port 70000: expected 0 (off) to 65535"),
])
def test_a_bad_flag_is_a_one_line_error(config: Path, flags: list[str], message: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["extproc", "--config", str(config), *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_cascade_mode_plan_is_a_one_line_error(config: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"tiers": ["small", "medium", "large"], "routing": "cascade", "operating_points": []}))
    assert main(["extproc", "--config", str(config), "--plan", str(plan)]) == 2
    assert "cascade mode" in capsys.readouterr().err


def test_the_server_stops_cleanly_on_sigterm(config: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "extproc.log"
    with process([*CASCADE, "extproc", "--config", str(config), "--port", str(port), "--metrics-port", "0"],
                 log) as proc:
        wait_port(port, proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, log.read_text()
