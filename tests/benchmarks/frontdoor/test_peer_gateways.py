"""benchmarks/frontdoor/peer_gateways.py end to end in its --quick mode (well under a minute): the fake engine directly and
through `cascade serve`, with SGLang's model gateway beside them when its wheel installs (else reported skipped,
with why). Structure only: the numbers are the script's to report, not the test's to judge."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cascade.testing.processes import run

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.frontdoor.peer_gateways"


@pytest.mark.timeout(600)
def test_a_quick_run_measures_direct_and_cascade_and_reports_the_peer_or_why_it_was_skipped(tmp_path: Path) -> None:
    done = run([sys.executable, "-m", MODULE, "--quick", "--peers", "smg", "--out", str(tmp_path / "r.json")],
               timeout_s=580, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    assert json.loads((tmp_path / "r.json").read_text()) == result
    targets = result["targets"]
    ran = [name for name in ("direct", "cascade", "smg") if "closed" in targets[name]]
    assert ran[:2] == ["direct", "cascade"]
    for name in ran:
        for cell in targets[name]["closed"].values():
            assert cell["requests"] > 0 and cell["errors"] == 0
        assert targets[name]["ladder"] and all(step["requests"] > 0 for step in targets[name]["ladder"])
    for name in ran[1:]:
        assert set(result["added_ttft_ms"][name]) == {"c1", "c4"}
        assert result["cpu_s_per_1000_requests"][name] > 0
    if "smg" in ran:
        assert result["goal"]["met"] in (True, False) and set(result["goal"]["added_p50_gap_ms"]) == {"c1", "c4"}
    else:
        assert targets["smg"]["skipped"] and result["goal"]["met"] is None
    assert {"direct_ceiling_rps", "client_bottleneck", "engine_bottleneck"} <= set(result["checks"])
