"""`cascade optimize drift`: a plan against synthetic gateway traffic logs, and the re-plan."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest

from cascade.cli import main
from cascade.optimizer.drift import Settings, check
from cascade.optimizer.planner import plan_problem
from cascade.optimizer.problem import load_problem
from cascade.optimizer.traffic import read_window
from cascade.plan import Plan, load_plan
from cascade.schemas import TrafficRecord

from .conftest import SMALL_PROBLEM

T0 = 1_700_000_000.0


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(problem.toml, plan.json): the small route problem, planned once for the module."""
    base = tmp_path_factory.mktemp("drift")
    spec = base / "problem.toml"
    spec.write_text(SMALL_PROBLEM.format(mode="route"))
    problem, base_dir = load_problem(spec)
    path = base / "plan.json"
    path.write_bytes(msgspec.json.encode(plan_problem(problem, base_dir).plan))
    return spec, path


def answered(plan: Plan, fractions: list[float]) -> np.ndarray:
    f = np.asarray(fractions)
    if plan.routing == "cascade":
        f = np.clip(f - np.append(f[1:], 0.0), 0, None)
    return f / f.sum()


def synthesize(plan: Plan, n: int = 1500, seed: int = 0, *, rate_scale: float = 1.0,
               hints: dict[str, float] | None = None, tier_shares: dict[str, list[float]] | None = None,
               output_scale: float = 1.0, latency_scale: float = 1.0, start: float = T0,
               out_of_domain_share: float = 0.01) -> list[TrafficRecord]:
    """Traffic as the gateway would log it if the plan held (each knob departs from it): Poisson
    arrivals at the plan's rate, each hint's tiers drawn from its point's shares, token counts around
    the point's per-tier means, latencies well below the predicted p95, and routed by a learned router that
    finds ~1% of the prompts out of its domain (as on the traffic it learned)."""
    rng = np.random.default_rng(seed)
    assert plan.planner is not None
    mix = hints or {"balanced": 1.0}
    points = {p.hint: p for p in plan.operating_points}
    deployed = {d.tier: d for d in plan.deployment}
    times = start + np.cumsum(rng.exponential(1.0 / (plan.planner.rate_rps * rate_scale), size=n))
    names = list(mix)
    drawn = rng.choice(len(names), size=n, p=np.asarray(list(mix.values())) / sum(mix.values()))
    records = []
    for ts, h in zip(times, drawn, strict=True):
        hint = names[h]
        point = points.get(hint, points["balanced"])
        shares = (tier_shares or {}).get(hint)
        p = np.asarray(shares) if shares is not None else answered(plan, point.tier_fractions)
        tier = 1 if hint == "bypass" else int(rng.choice(len(plan.tiers), p=p))
        noise = rng.lognormal(-0.045, 0.3, size=2)  # mean 1
        predicted = deployed[plan.tiers[tier]].predicted_p95_latency_s
        assert predicted is not None
        out_of_domain = hint != "bypass" and bool(rng.random() < out_of_domain_share)
        router = "bypass" if hint == "bypass" else "heuristic" if out_of_domain else "learned"
        records.append(TrafficRecord(
            ts=round(float(ts), 3), hint=hint, router=router, tier=tier, tier_name=plan.tiers[tier],
            out_of_domain=out_of_domain,
            latency_s=round(float(rng.uniform(0.2, 0.6) * predicted * latency_scale), 4),
            prompt_tokens=round(float(point.mean_prompt_tokens[tier] * noise[0])),
            completion_tokens=round(float(point.mean_output_tokens[tier] * noise[1] * output_scale)),
            escalations=tier if plan.routing == "cascade" and hint != "bypass" else 0))
    return records


def write_log(path: Path, records: list[TrafficRecord], extra_lines: list[bytes] = ()) -> Path:
    encode = msgspec.json.encode
    path.write_bytes(b"".join(encode(r) + b"\n" for r in records) + b"".join(line + b"\n" for line in extra_lines))
    return path


def drift_json(plan_path: Path, log: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["optimize", "drift", "--plan", str(plan_path), "--traffic", str(log), "--json", *args])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def reasons(report: dict) -> set[str]:
    return {r["check"] for r in report["reasons"]}


def test_the_planner_records_the_workload_drift_compares_with(planned) -> None:
    plan = load_plan(planned[1])
    assert plan.workload is not None and plan.workload.rate_rps == 4.0
    assert len(plan.workload.mean_output_tokens_per_tier) == 2 and plan.workload.mean_prompt_tokens > 0
    balanced = next(p for p in plan.operating_points if p.hint == "balanced")
    assert len(balanced.mean_prompt_tokens) == 2 and all(x > 0 for x in balanced.mean_output_tokens)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_traffic_that_matches_the_plan_is_ok(planned, tmp_path, capsys, seed) -> None:
    plan = load_plan(planned[1])
    records = synthesize(plan, seed=seed, hints={"balanced": 0.9, "fast": 0.06, "bypass": 0.04})
    code, report = drift_json(planned[1], write_log(tmp_path / "traffic.jsonl", records), capsys)
    assert code == 0
    assert report["verdict"] == "ok", report["reasons"]
    assert {name: c["status"] for name, c in report["checks"].items()} == dict.fromkeys(
        ["rate", "tier_mix", "hint_mix", "tokens", "tier_load", "latency", "domain"], "ok")
    assert report["window"]["records"] == len(records) and report["window"]["malformed_lines"] == 0
    assert report["checks"]["tier_mix"]["hints"]["bypass"]["status"] == "skipped"  # no operating point
    assert abs(report["checks"]["rate"]["ratio"] - 1) < 0.1


@pytest.mark.parametrize(("knobs", "expected", "number"), [
    ({"rate_scale": 2.0}, {"rate"}, lambda r: r["checks"]["rate"]["ratio"]),
    ({"tier_shares": {"balanced": [0.3, 0.7]}}, {"tier_mix"},
     lambda r: r["checks"]["tier_mix"]["hints"]["balanced"]["observed"][1]),
    ({"output_scale": 2.0}, {"tokens"}, lambda r: r["checks"]["tokens"]["completion"]["ratio"]),
    ({"hints": {"best": 0.7, "balanced": 0.3}}, {"hint_mix"},
     lambda r: r["checks"]["hint_mix"]["observed"]["best"]),
    ({"latency_scale": 3.0}, {"latency"}, lambda r: r["checks"]["latency"]["tiers"]["large"]["ratio"]),
    ({"out_of_domain_share": 0.2}, {"domain"}, lambda r: r["checks"]["domain"]["observed_share"]),
], ids=["rate-doubled", "tier-mix-shifted", "longer-outputs", "hint-mix-to-best", "slower-tiers", "new-kind-of-prompts"])
def test_traffic_that_departs_from_the_plan_is_drift_for_the_right_reason(planned, tmp_path, capsys, knobs,
                                                                         expected, number) -> None:
    plan = load_plan(planned[1])
    code, report = drift_json(planned[1], write_log(tmp_path / "t.jsonl", synthesize(plan, **knobs)), capsys)
    assert code == 0  # a report, not a failure
    assert report["verdict"] == "drift" and reasons(report) == expected, report["reasons"]
    assert all(any(ch.isdigit() for ch in r["detail"]) for r in report["reasons"])  # each reason has its numbers
    value = number(report)
    target = {"rate": 2.0, "tier_mix": 0.7, "tokens": 2.0, "hint_mix": 0.7, "domain": 0.2}.get(next(iter(expected)))
    if target is not None:
        assert value == pytest.approx(target, rel=0.12)
    else:
        assert value > 1.25


def test_fail_on_drift_exits_3_and_the_text_report_names_the_reason(planned, tmp_path, capsys) -> None:
    plan = load_plan(planned[1])
    log = write_log(tmp_path / "t.jsonl", synthesize(plan, rate_scale=2.0))
    assert main(["optimize", "drift", "--plan", str(planned[1]), "--traffic", str(log), "--fail-on-drift"]) == 3
    text = capsys.readouterr().out
    assert text.startswith("verdict: drift") and "- rate: arrival rate" in text
    assert re.search(r"  domain +ok +[0-9.]+% of [0-9]+ learned-routed requests out of the router.s domain", text)
    ok = write_log(tmp_path / "ok.jsonl", synthesize(plan))
    assert main(["optimize", "drift", "--plan", str(planned[1]), "--traffic", str(ok), "--fail-on-drift"]) == 0


def test_malformed_lines_are_skipped_and_counted(planned, tmp_path, capsys) -> None:
    plan = load_plan(planned[1])
    bad = [b"not json", b'{"ts": 1.0, "hint": "balanced"}', b'{"ts": 1.7e9, "hint": "balanced", "router": "r", '
           b'"tier": 0, "tier_name": "small", "latency_s": -1, "prompt_tokens": 1, "completion_tokens": 1}', b""]
    log = write_log(tmp_path / "t.jsonl", synthesize(plan, n=400), bad)
    code, report = drift_json(planned[1], log, capsys)
    assert code == 0 and report["window"]["malformed_lines"] == 3 and report["window"]["records"] == 400
    assert report["verdict"] == "ok", report["reasons"]


def test_the_window_keeps_only_the_last_seconds(planned, tmp_path) -> None:
    plan = load_plan(planned[1])
    old = synthesize(plan, n=300, seed=1, rate_scale=5.0, start=T0 - 20_000)
    recent = synthesize(plan, n=600, seed=2)
    window = read_window(write_log(tmp_path / "t.jsonl", old + recent), 3600, len(plan.tiers))
    assert len(window.records) == 600 and window.records[0].ts >= T0
    report = check(plan, window, Settings())
    assert report["checks"]["rate"]["status"] == "ok"


def test_too_few_records_are_not_judged(planned, tmp_path) -> None:
    plan = load_plan(planned[1])
    window = read_window(write_log(tmp_path / "t.jsonl", synthesize(plan, n=10, rate_scale=3.0)), 3600, 2)
    report = check(plan, window, Settings())
    assert report["verdict"] == "ok" and report["checks"]["rate"]["status"] == "skipped"
    assert "too few" in report["checks"]["rate"]["note"]


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read traffic log"),
    (b"", "no usable traffic record"),
    (b"garbage\n{}\n", "no usable traffic record in the last 3600 s (2 malformed"),
])
def test_a_missing_or_empty_log_is_one_line_and_exit_2(planned, tmp_path, capsys, content, message) -> None:
    log = tmp_path / "traffic.jsonl"
    if content is not None:
        log.write_bytes(content)
    assert main(["optimize", "drift", "--plan", str(planned[1]), "--traffic", str(log)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_records_of_tiers_the_plan_lacks_are_counted_not_used(planned, tmp_path) -> None:
    plan = load_plan(planned[1])
    records = synthesize(plan, n=200)
    foreign = msgspec.structs.replace(records[-1], tier=5, tier_name="huge")
    window = read_window(write_log(tmp_path / "t.jsonl", [*records, foreign]), 3600, 2)
    assert window.unknown_tier == 1 and len(window.records) == 200


def test_an_old_plan_without_workload_lengths_still_loads_and_skips_the_token_check(planned, tmp_path, capsys) -> None:
    data = json.loads(planned[1].read_text())
    data.pop("workload")
    for point in data["operating_points"]:
        point.pop("mean_prompt_tokens"), point.pop("mean_output_tokens")
    old = tmp_path / "old-plan.json"
    old.write_text(json.dumps(data))
    assert load_plan(old).workload is None
    records = synthesize(load_plan(planned[1]), output_scale=3.0)
    code, report = drift_json(old, write_log(tmp_path / "t.jsonl", records), capsys)
    assert code == 0 and report["checks"]["tokens"]["status"] == "skipped"
    assert "no workload lengths" in report["checks"]["tokens"]["note"]


def cascade_plan() -> Plan:
    """Hand-written cascade plan: tier fractions are reach (100% start on tier 0, 40% escalate)."""
    point = {"hint": "balanced", "thresholds": [0.8], "tier_fractions": [1.0, 0.4], "quality_target": 0.9,
             "predicted_e2e_p95_latency_s": 20.0, "mean_prompt_tokens": [80, 90], "mean_output_tokens": [400, 600]}
    deployment = [{"tier": "a", "gpus": 2, "replicas": 2, "arrival_rate_rps": 2.0, "capacity_rps": 6.0,
                   "predicted_p95_latency_s": 8.0},
                  {"tier": "b", "gpus": 6, "replicas": 1, "tp": 4, "arrival_rate_rps": 0.8, "capacity_rps": 1.0,
                   "predicted_p95_latency_s": 12.0}]
    planner = {"objective": "penalty", "quality_target": 0.9, "mu": 100.0, "quality_utopia": 0.95,
               "quality_nadir": 0.7, "objective_value": 12.0, "rounds": 2, "solve_time_s": 1.0, "rate_rps": 2.0,
               "slo_percentile": 95.0}
    raw = {"tiers": ["a", "b"], "routing": "cascade", "operating_points": [point], "deployment": deployment,
           "planner": planner}
    return msgspec.json.decode(json.dumps(raw), type=Plan)


def test_a_cascade_plan_counts_reach_as_load_and_answers_as_the_tier_mix(tmp_path) -> None:
    plan = cascade_plan()
    records = synthesize(plan, n=1000)
    window = read_window(write_log(tmp_path / "t.jsonl", records), 3600, 2)
    report = check(plan, window, Settings())
    assert report["checks"]["tier_mix"]["hints"]["balanced"]["planned"] == [0.6, 0.4]
    assert report["verdict"] == "ok", report["reasons"]
    # Escalated requests ran on tier a first: a processes every request, b 40% of them.
    loads = report["checks"]["tier_load"]["tiers"]
    assert loads["a"]["observed_rps"] == pytest.approx(2.0, rel=0.1)
    assert loads["b"]["observed_rps"] == pytest.approx(0.8, rel=0.15)
    busier = check(plan, read_window(write_log(tmp_path / "u.jsonl", synthesize(plan, n=1000, rate_scale=1.5)),
                                     3600, 2), Settings())
    assert {"rate", "tier_load"} <= reasons(busier)  # b: 1.2 req/s on a 1.0 req/s capacity
    assert busier["checks"]["tier_load"]["tiers"]["b"]["status"] == "drift"


def test_bad_thresholds_are_one_line_and_exit_2(planned, tmp_path, capsys) -> None:
    log = write_log(tmp_path / "t.jsonl", synthesize(load_plan(planned[1]), n=100))
    assert main(["optimize", "drift", "--plan", str(planned[1]), "--traffic", str(log), "--rate-band", "0"]) == 2
    assert "--rate-band" in capsys.readouterr().err
    assert main(["optimize", "drift", "--plan", str(planned[1]), "--traffic", str(log),
                 "--out-of-domain-share", "1.5"]) == 2
    assert "--out-of-domain-share" in capsys.readouterr().err
    assert main(["optimize", "drift", "--plan", str(planned[1]), "--traffic", str(log), "--spec", "x.toml"]) == 2
    assert "--spec and --out go together" in capsys.readouterr().err


def test_replanning_uses_the_observed_rate_and_lengths(planned, tmp_path, capsys) -> None:
    spec, plan_path = planned
    plan = load_plan(plan_path)
    log = write_log(tmp_path / "t.jsonl", synthesize(plan, rate_scale=2.0, output_scale=1.5, seed=4))
    out = tmp_path / "new" / "plan.json"
    code, report = drift_json(plan_path, log, capsys, "--spec", str(spec), "--out", str(out))
    assert code == 0 and reasons(report) >= {"rate", "tokens"}
    replan = report["replan"]
    new = load_plan(out)
    assert replan["plan"] == str(out) and Path(replan["report"]).exists()
    assert replan["rate_source"] == "traffic"
    assert new.workload is not None and new.planner is not None
    assert new.planner.rate_rps == pytest.approx(report["checks"]["rate"]["observed_rps"])
    assert new.planner.rate_rps == pytest.approx(8.0, rel=0.1)
    assert replan["length_scale"]["output"]["small"] == pytest.approx(1.5, rel=0.1)
    assert plan.workload is not None
    assert new.workload.mean_output_tokens_per_tier[0] == pytest.approx(
        1.5 * plan.workload.mean_output_tokens_per_tier[0], rel=0.1)
    balanced = replan["hints"]["balanced"]
    assert set(balanced["old"]) == set(balanced["new"]) == {
        "predicted_p95_latency_s", "predicted_e2e_p95_latency_s", "predicted_throughput_rps", "predicted_quality"}
    assert set(replan["allocation"]["new"]) == {"small", "large"}
    # The new plan fits the traffic it was made from better than the old one on the rate.
    again = check(new, read_window(log, 3600, 2), Settings())
    assert again["checks"]["rate"]["status"] == "ok"


def test_replanning_a_problem_with_other_tiers_is_refused(planned, tmp_path, capsys) -> None:
    other = tmp_path / "other.toml"
    other.write_text(SMALL_PROBLEM.format(mode="route").replace('name = "large"', 'name = "huge"'))
    log = write_log(tmp_path / "t.jsonl", synthesize(load_plan(planned[1]), n=100))
    code = main(["optimize", "drift", "--plan", str(planned[1]), "--traffic", str(log), "--spec", str(other),
                 "--out", str(tmp_path / "n.json")])
    assert code == 2 and "the plan has small, large" in capsys.readouterr().err


def test_drift_help_imports_no_solver() -> None:
    probe = ("import sys\nfrom cascade.cli import main\ntry:\n    main(['optimize', 'drift', '--help'])\n"
             "except SystemExit as e:\n    assert e.code == 0\n"
             "print(sorted(m for m in ('highspy', 'pymoo', 'matplotlib', 'scipy', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "fail-on-drift" in result.stdout and result.stdout.strip().splitlines()[-1] == "[]"


def test_the_domain_check_skips_a_gateway_without_a_learned_router(planned, tmp_path) -> None:
    plan = load_plan(planned[1])
    records = [msgspec.structs.replace(r, router="heuristic", out_of_domain=False) for r in synthesize(plan)]
    report = check(plan, read_window(write_log(tmp_path / "t.jsonl", records), 1e9, 2), Settings())
    assert report["checks"]["domain"]["status"] == "skipped" and report["checks"]["domain"]["n"] == 0
    few = synthesize(plan, n=30, out_of_domain_share=0.5)
    report = check(plan, read_window(write_log(tmp_path / "few.jsonl", few), 1e9, 2), Settings())
    assert report["checks"]["domain"]["status"] == "skipped" and "--min-requests" in report["checks"]["domain"]["note"]
