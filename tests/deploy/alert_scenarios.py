"""`promtool test rules` input for cascade's alerting rules (cascade/deploy/monitoring/alerts.py): a healthy
deployment on which no alert fires, and a faulty one on which each alert fires for exactly the tier, replica,
instance or key at fault. Series are Prometheus' expanding notation (`0+60x40`: 0, 60, 120, ... one a minute)."""

from __future__ import annotations

from typing import Any

from cascade.deploy.monitoring.alerts import RULES

G1 = 'instance="g1",job="cascade"'
G2 = 'instance="g2",job="cascade"'
MINUTES = 40


def _series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


def _constant(value: float) -> str:
    return f"{value:g}x{MINUTES}"


def _per_minute(increase: float) -> str:
    return f"0+{increase:g}x{MINUTES}"


def _ttft(tier: str, below_1s: float, below_5s: float) -> list[dict[str, str]]:
    """A TTFT histogram whose buckets grow by these counts a minute (le 1, 5, +Inf)."""
    return [_series("cascade_ttft_seconds_bucket", f'{G1},tier="{tier}",le="{le}"', _per_minute(n))
            for le, n in (("1", below_1s), ("5", below_5s), ("+Inf", below_5s))]


def _replica(instance: str, tier: str, breaker: int, health: int) -> list[dict[str, str]]:
    labels = f'{instance},tier="{tier}",replica="0"'
    return [_series("cascade_replica_breaker_state", labels, _constant(breaker)),
            _series("cascade_replica_health_state", labels, _constant(health))]


def _healthy() -> list[dict[str, str]]:
    return [
        _series("up", G1, _constant(1)),
        *_replica(G1, "a", 0, 0), *_replica(G1, "b", 1, 0),  # a half-open breaker still serves
        _series("cascade_requests_total", f'{G1},tier="a",outcome="ok"', _per_minute(600)),
        _series("cascade_requests_total", f'{G1},tier="a",outcome="backend_error"', _per_minute(6)),  # 1%
        *_ttft("a", 60, 60),
        _series("cascade_engine_load_fresh", f'{G1},tier="a",backend="0"', _constant(1)),
        _series("cascade_redis_up", G1, _constant(1)),
        _series("cascade_redis_fail_closed_total", f'{G1},op="acquire"', _constant(0)),
        _series("cascade_redis_settles_dropped_total", G1, _constant(3)),  # old drops, none lately
        _series("cascade_key_rate_limited_total", f'{G1},key="team-a",limit="requests"', _per_minute(0.5)),
        _series("cascade_key_budget_downgraded_total", f'{G1},key="team-a"', _constant(7)),  # last period's
        _series("cascade_key_budget", f'{G1},key="team-a"', _constant(100)),
        _series("cascade_key_budget_spent", f'{G1},key="team-a"', "0+2x40"),  # 80 of 100 at minute 40
        _series("cascade_router_decision_seconds_count", G1, _per_minute(600)),
        _series("cascade_router_out_of_domain_total", G1, _per_minute(60)),  # 10%
        _series("cascade_degraded_requests_total", f'{G1},requested="balanced",served="fast",branches_cut="no"',
                _per_minute(30)),  # 5%
    ]


def _faulty() -> list[dict[str, str]]:
    return [
        _series("up", G1, _constant(1)), _series("up", G2, _constant(0)),
        *_replica(G1, "a", 0, 0), *_replica(G1, "b", 0, 2),  # g1: tier b's only engine is down
        *_replica(G2, "a", 2, 0),  # g2: its only tier's only replica is benched
        _series("cascade_requests_total", f'{G1},tier="a",outcome="ok"', _per_minute(60)),
        _series("cascade_requests_total", f'{G1},tier="a",outcome="backend_error"', _per_minute(12)),  # 17%
        _series("cascade_requests_total", f'{G1},tier="b",outcome="ok"', _per_minute(60)),
        *_ttft("a", 30, 60), *_ttft("b", 60, 60),  # a: p99 about 4.9 s; b: under 1 s
        _series("cascade_engine_load_fresh", f'{G1},tier="a",backend="0"', _constant(0)),
        _series("cascade_redis_up", G1, _constant(0)),
        _series("cascade_redis_fail_closed_total", f'{G1},op="acquire"', _per_minute(5)),
        _series("cascade_redis_settles_dropped_total", G1, f"0x{MINUTES - 10} 1x9"),  # one at minute 31
        _series("cascade_key_rate_limited_total", f'{G1},key="team-a",limit="requests"', _per_minute(3)),
        _series("cascade_key_budget_downgraded_total", f'{G1},key="team-a"', f"0x{MINUTES - 10} 0+4x9"),
        *[_series("cascade_key_budget", f'{g},key="team-a"', _constant(100)) for g in (G1, G2)],
        _series("cascade_key_budget_spent", f'{G1},key="team-a"', "0+3x40"),  # 90 of 100 at minute 30, 105 at 35
        _series("cascade_key_budget_spent", f'{G2},key="team-a"', "0+1x40"),  # another gateway's older reading
        _series("cascade_key_budget", f'{G1},key="team-b"', _constant(100)),
        _series("cascade_key_budget_spent", f'{G1},key="team-b"', _constant(50)),
        _series("cascade_router_decision_seconds_count", G1, _per_minute(60)),
        _series("cascade_router_out_of_domain_total", G1, _per_minute(30)),  # 50%
        _series("cascade_degraded_requests_total", f'{G1},requested="balanced",served="fast",branches_cut="no"',
                _per_minute(60)),  # 60 of the 132 requests a minute
    ]


def _labels(severity: str, **labels: str) -> list[dict[str, Any]]:
    return [{"exp_labels": {"severity": severity, **labels}}]


_G1, _G2 = {"instance": "g1", "job": "cascade"}, {"instance": "g2", "job": "cascade"}

# alert -> what fires on the faulty deployment at EVAL (each its labels; several alerts fire more than once).
EVAL = "35m"
FAULTY: dict[str, list[dict[str, Any]]] = {
    "CascadeGatewayDown": _labels("critical", **_G2),
    "CascadeNoTierCanServe": _labels("critical", instance="g2"),
    "CascadeTierCannotServe": _labels("warning", instance="g1", tier="b") + _labels("warning", instance="g2",
                                                                                      tier="a"),
    "CascadeTierErrorRatioHigh": _labels("warning", tier="a"),
    "CascadeTTFTHigh": _labels("warning", tier="a"),
    "CascadeBreakerOpen": _labels("warning", **_G2, tier="a", replica="0"),
    "CascadeReplicaDown": _labels("warning", **_G1, tier="b", replica="0"),
    "CascadeEngineLoadStale": _labels("info", **_G1, tier="a", backend="0"),
    "CascadeRedisDown": _labels("critical", **_G1),
    "CascadeRedisFailingClosed": _labels("critical", instance="g1"),
    "CascadeRedisSettlesDropped": _labels("warning", **_G1),
    "CascadeKeyOverLimit": _labels("info", key="team-a", limit="requests"),
    "CascadeKeyNearBudget": _labels("info", key="team-a"),
    "CascadeKeyBudgetNearlySpent": _labels("info", key="team-a"),
    "CascadeRouterOutOfDomain": _labels("info"),
    "CascadeDegradedServing": _labels("warning"),
}


def rule_tests(rule_file: str) -> dict[str, Any]:
    """The test file for `promtool test rules` (JSON is YAML), every alert of RULES covered."""
    assert set(FAULTY) == {r.alert for r in RULES}, "every alert needs a scenario here"
    return {
        "rule_files": [rule_file], "evaluation_interval": "1m",
        "tests": [
            {"name": "healthy", "interval": "1m", "input_series": _healthy(),
             "alert_rule_test": [{"eval_time": EVAL, "alertname": name, "exp_alerts": []} for name in FAULTY]},
            {"name": "faulty", "interval": "1m", "input_series": _faulty(),
             "alert_rule_test": [{"eval_time": EVAL, "alertname": name, "exp_alerts": fired}
                                 for name, fired in FAULTY.items()]},
        ],
    }
