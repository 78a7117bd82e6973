"""benchmarks/frontdoor/hostile_clients.py: its corpus is what it says, a case is charged with the normal requests in flight
beside it, the attacks' bills and budget are judged as documented (hostile_checks.py), and a smoke run (`--quick`: the
gateway, one short phase each) prints one JSON object with the normal clients' latency and errors with and without the
attacker, says it is not meaningful for latency, and passes the billing, budget and leak checks. No timing is
asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.frontdoor import hostile_attacks as attacks
from benchmarks.frontdoor import hostile_checks as checks
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


def test_a_cut_stream_is_billed_what_the_budget_left_after_it_and_the_next_one_say() -> None:
    # Budget 1,000 tokens, reservation 100: before the first cut the key had spent 0 (left 900 after reserving), 60
    # before the second (left 840), 125 once both had settled.
    cut = {"sent": [{"outcome": "200", "budget_left": 900.0}, {"outcome": "429:budget_refused", "budget_left": None},
                    {"outcome": "200", "budget_left": 840.0}], "spent_after": 125.0}
    assert checks.cut_bills(cut, reserved=100, budget=1000.0) == [60.0, 65.0]
    billing = checks.cut_billing([cut], prompt_bound=62, reserved=100, budget=1000.0)
    assert billing["billed_below_prompt"] == 1 and billing["every_cut_billed_its_prompt"] is False
    assert checks.cut_billing([cut], prompt_bound=60, reserved=100, budget=1000.0)["every_cut_billed_its_prompt"]
    assert checks.cut_bills({"sent": cut["sent"], "spent_after": None}, 100, 1000.0) == []  # through Envoy


def test_a_usage_fault_must_be_billed_its_reservation_and_never_be_a_500() -> None:
    def lie(outcome: str, billed: float | None) -> dict:
        return {"kind": "negative_prompt", "stream": False, "outcome": outcome, "billed": billed, "reserved": 173,
                "prompt_bound": 157}

    held = checks.lie_billing([lie("502:usage_fault", 173.0), lie("502:unreadable_chunk", 0.0)])
    assert held["usage_faults_billed_at_reservation"] is True and held["status_500"] == 0
    short = checks.lie_billing([lie("502:usage_fault", 157.0), lie("500:other_error", 0.0),
                                lie("429:in_flight_refused", 0.0)])
    assert short["usage_faults_billed_at_reservation"] is False
    assert short["status_500"] == 1 and short["in_flight_refused"] == 1
    assert checks.lie_billing([lie("200:answered", None)])["usage_faults_billed_at_reservation"] is None


def test_the_budget_holds_within_one_worst_case_beyond_it_as_a_refusal_states_it() -> None:
    refusal = ('{"error":{"message":"You exceeded your current quota: API key `budget-drain` has spent 0.512446 USD '
               'of its budget of 0.5 USD per 31622400 s (its requests in flight count at their worst case)."}}')
    assert checks.spent_in_refusal(refusal) == 0.512446
    drained = {"outcomes": {"cut:200": 16, "lie:502:usage_fault": 6, "cut:429:budget_refused": 1},
               "refusal_after": (429, refusal), "gauge_tokens": 512446.0}
    held = checks.budget(drained, 0.5, 0.031978, cut=(31962, 31978), lie=(157, 173))
    assert held["budget_held"] and held["reached"] and held["overspend"] == 0.012446
    assert held["spent_within_bills"] and held["admitted"] == {"cuts": 16, "lies": 6}
    assert not checks.budget(drained, 0.5, 0.01, cut=(31962, 31978), lie=(157, 173))["budget_held"]
    unreached = checks.budget({**drained, "refusal_after": (200, "{}")}, 0.5, 0.031978, (31962, 31978), (157, 173))
    assert not unreached["reached"] and not unreached["budget_held"]


def test_the_attacks_keys_are_gateway_keys_with_a_budget_and_the_lies_ask_the_engine_to_lie() -> None:
    keys = attacks.attack_keys(readers=4, drain_workers=4, drain_budget=0.5)
    assert len({key.name for key in keys.values()}) == len({key.key for key in keys.values()}) == 4
    assert keys["liar"].max_in_flight == 1 and keys["drain"].budget == 0.5
    assert all("budget = " in key.toml() and "downgrade_at" in key.toml() for key in keys.values())
    body = json.loads(attacks.lie_body("prompt_10e12", stream=True))
    assert body["model"] == attacks.ATTACK_TIER and '"prompt_tokens":1000000000000' in body["messages"][0]["content"]
    bound, most = attacks.reserved(attacks.CUT_BODY)
    assert bound > 30_000 and most == bound + attacks.DEFAULT_MAX_TOKENS


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
        verdicts = target["attacks"]["verdicts"]
        for check in ("every_cut_billed_its_prompt", "usage_faults_billed_at_reservation", "no_status_500",
                      "no_place_leaked", "budget_held", "drain_billed_as_promised"):
            assert verdicts[check] is True, (check, target["attacks"])
        assert verdicts["slow_bodies_closed"] is None  # not waited out in a quick run
    assert isinstance(result["goal_met"], bool)
    assert result["meaningful"] is False and "p99" in result["why"]
    assert attacks.ATTACK_TIER not in {tier for tiers in result["normal_routes"].values() for tier in tiers}
