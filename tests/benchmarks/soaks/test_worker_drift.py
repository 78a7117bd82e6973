"""benchmarks/soaks/worker_drift.py against the fake engine over real HTTP: probes, load rounds, JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.soaks.worker_drift"


def test_probes_before_and_after_each_round_and_the_load_reaches_the_engine(tmp_path: Path) -> None:
    engine = FakeEngine(FakeScript(tokens=8, itl_ms=5))
    with serve_asgi(engine) as url:
        result = subprocess.run([sys.executable, "-m", MODULE, "--url", url, "--rounds", "2", "--requests", "6",
                                 "--concurrency", "3", "--probe-requests", "2", "--probe-tokens", "8",
                                 "--load-tokens", "4", "--out", str(tmp_path)],
                                capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert [p["served"] for p in report["probes"]] == [0, 6, 12]
    assert all(p["itl_ms"] > 0 for p in report["probes"])
    assert report["spread_max_over_min"] >= 1.0 and report["last_over_first"] > 0
    assert {"slope_ms_per_100_requests", "config"} <= set(report)
    assert engine.stats.requests == 2 * 6 + 3 * 2  # every load request and every probe reached the engine


def test_bad_counts_are_refused_with_exit_2() -> None:
    result = subprocess.run([sys.executable, "-m", MODULE, "--url", "http://127.0.0.1:9", "--rounds", "0"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2 and "--probe-tokens" in result.stderr
