"""benchmarks/frontdoor/hostile_clients.py: its corpus is what it says, a case is charged with the normal requests in flight
beside it, and a smoke run (`--quick`: real gateway, Envoy and ext_proc, one short phase each) prints one JSON
object with the normal clients' latency and errors with and without the attacker. No timing is asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.frontdoor import hostile_clients as hostile
from cascade.testing.processes import run

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.frontdoor.hostile_clients"


def test_the_corpus_holds_the_cases_that_broke_a_gateway_at_their_sizes() -> None:
    cases = {case.name: case for case in hostile.corpus()}
    assert len(cases) == len(hostile.corpus())  # names are unique
    assert len(cases["body_at_max_body_bytes"].body) == hostile.MAX_BODY
    assert len(cases["body_one_over_max_body_bytes"].body) == hostile.MAX_BODY + 1
    assert json.loads(cases["newlines_60k"].body)["messages"][-1]["content"] == "\n" * 60_000 + "a"
    assert cases["tool_schema_3000_deep"].body.count(b"{") > 3_000
    assert b"\xff" in cases["invalid_utf8"].body
    assert all(len(case.body) <= hostile.MAX_BODY + 1 for case in cases.values())


def test_a_case_is_charged_with_the_normal_requests_in_flight_beside_it() -> None:
    phase = {"sent": [("digits_60k", 1.0, 1.2, "200"), ("bad_key", 3.0, 3.001, "401")],
             "samples": [(0.9, 1.05, "ok"), (1.1, 1.3, "status_503"), (2.0, 2.1, "ok")]}
    cases = hostile.by_case([phase])
    assert cases["digits_60k"]["normal_beside"] == {"n": 2, "errors": 1, "p99_ms": 150.0, "mean_ms": 150.0}
    assert cases["digits_60k"]["statuses"] == {"200": 1}
    assert cases["bad_key"]["normal_beside"] == {"n": 0, "errors": 0, "p99_ms": None, "mean_ms": None}


def test_a_quick_run_prints_both_conditions_per_target(tmp_path: Path) -> None:
    out = tmp_path / "hostile.json"
    # The gateway only: Envoy's start would double the test's time, and the ext_proc path is the benchmark run's.
    args = ["--quick", "--no-envoy", "--out", str(out)]
    done = run([sys.executable, "-m", MODULE, *args], timeout_s=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    assert result == json.loads(out.read_text())
    assert set(result["targets"]) == {"gateway"}
    for target in result["targets"].values():
        for condition in ("without_attacker", "with_attacker"):
            normal = target[condition]
            assert normal["requests"] > 0 and normal["errors"] >= 0
            assert normal["p50_ms"] is not None and normal["p99_ms"] >= normal["p50_ms"]
            assert all(seconds >= 0 for seconds in normal["cpu_s"].values())
        assert set(target["goal"]) == {"p99_change_under_10pct", "zero_errors_with_attacker"}
        assert len(target["p99_change_pct_per_round"]) == 1 and "p99_change_pct_95ci" in target
        assert set(target["cpu_ms_per_request_by_case"]) == {"normal_request", *result["config"]["corpus"]}
        assert target["attacker"]["sent"] > 0 and set(target["attacker"]["cases"]) <= set(result["config"]["corpus"])
    assert isinstance(result["goal_met"], bool)
