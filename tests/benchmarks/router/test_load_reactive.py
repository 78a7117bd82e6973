"""benchmarks/router/load_reactive.py end to end on a short ramp (about a minute): three arms on the same arrivals,
the static one never degrades, the reactive one moves requests off the full direct tier."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cascade.testing.processes import run

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.router.load_reactive"


@pytest.mark.timeout(300)
def test_a_short_ramp_runs_every_arm_on_the_same_arrivals_and_only_reactive_arms_degrade(tmp_path: Path) -> None:
    command = [sys.executable, "-m", MODULE, "--rate", "1.5", "--steps", "1,3", "--phase-s", "5", "--bin-s", "5",
               "--out", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")]
    done = run(command, timeout_s=280, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    arms = result["arms"]
    assert list(arms) == ["static", "reactive_latency", "reactive"]
    for arm in arms.values():
        assert arm["overall"]["requests"] == result["requests"] > 0 and arm["overall"]["failed"] == 0
        assert [s["rate_x"] for s in arm["steps"]] == [1.0, 3.0]
    assert arms["static"]["degraded_requests"] == 0 and arms["reactive"]["degraded_requests"] > 0
    assert (tmp_path / "r.png").stat().st_size > 10_000
