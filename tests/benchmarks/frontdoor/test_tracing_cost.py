"""benchmarks/frontdoor/tracing_cost.py end to end on a few requests: every variant measured under both exporters, every span
of cascade's and the SDK's trees reaching the exporter. Structure only: the numbers are the script's to report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cascade.testing.processes import run

pytest.importorskip("opentelemetry.sdk")

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.frontdoor.tracing_cost"


@pytest.mark.timeout(120)
def test_a_short_run_reports_cpu_per_request_for_off_sdk_and_cascade_spans() -> None:
    done = run([sys.executable, "-m", MODULE, "--requests", "40", "--rounds", "2", "--calls", "2"], timeout_s=100, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    for exporting in ("null", "encode"):
        assert set(result["cpu_us_per_request"][exporting]) == {"off", "sdk", "cascade"}
        assert all(len(s) == 2 and min(s) > 0 for s in result["samples_us"][exporting].values())
        assert set(result["added_us_per_request"][exporting]) == {"sdk", "cascade"}
    assert result["spans_exported"] == {"off": 0, "sdk": 4 * 140, "cascade": 4 * 140}  # 2 + calls per request
