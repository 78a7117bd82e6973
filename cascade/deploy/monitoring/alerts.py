"""Prometheus alerting rules for a cascade deployment, from one table (`RULES`), written as Prometheus' rule file
(YAML). Thresholds are module constants: an operator with other SLOs changes them here and regenerates
(`python -m cascade.deploy.monitoring OUT`), or edits the written file.

Every rule names only series the gateway exports (tests/deploy/test_monitoring.py checks it against a running
gateway's /metrics) plus Prometheus' own `up`; with `promtool` installed, the same tests check the file with
`promtool check rules` and fire each alert from synthetic series with `promtool test rules`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

GROUP = "cascade-gateway"
JOB = "cascade"  # the scrape job's name that `CascadeGatewayDown` watches
ERROR_RATIO = 0.05  # a tier failing more than this share of its requests ...
ERROR_MIN_RPS = 0.05  # ... while serving at least this many requests per second (a few faults of a quiet tier: not)
TTFT_P99_SLO_S = 2.0  # streams' time to first token, p99 over 5 minutes, per tier
KEY_429_PER_MIN = 1.0  # a key refused (over one of its limits) more often than this
BUDGET_SPENT_SHARE = 0.9  # a key has spent (and reserved) more than this share of its budget this period
OUT_OF_DOMAIN_SHARE = 0.3  # routed prompts the learned router finds unlike its training data
DEGRADED_SHARE = 0.2  # requests load-reactive routing served at a cheaper operating point

_SERVES = "(cascade_replica_breaker_state < 2) and on (instance, tier, replica) (cascade_replica_health_state < 2)"


@dataclass(frozen=True)
class Rule:
    alert: str
    expr: str
    for_: str
    severity: str  # critical: clients are failing now; warning: they will, or some are; info: worth a look
    summary: str
    description: str
    labels: dict[str, str] = field(default_factory=dict)


RULES: tuple[Rule, ...] = (
    Rule("CascadeGatewayDown", f'up{{job="{JOB}"}} == 0', "1m", "critical",
         "Gateway {{ $labels.instance }} is not answering scrapes",
         f"Prometheus cannot scrape /metrics (job {JOB!r}): the process is down or its event loop is stuck."),
    Rule("CascadeNoTierCanServe",
         f"count by (instance) (cascade_replica_breaker_state) unless count by (instance) ({_SERVES})", "1m",
         "critical", "Gateway {{ $labels.instance }} has no tier that can serve",
         "Every replica of every tier is benched by its breaker or marked down by health checks: /ready answers "
         "503 and every chat completion fails."),
    Rule("CascadeTierCannotServe",
         f"count by (instance, tier) (cascade_replica_breaker_state) unless count by (instance, tier) ({_SERVES})",
         "2m", "warning", "Tier {{ $labels.tier }} cannot serve on {{ $labels.instance }}",
         "Every replica of the tier is benched or down: its requests fall back (route mode), escalate past it "
         "(cascade mode) or fail with 503; /ready says degraded."),
    Rule("CascadeTierErrorRatioHigh",
         f'sum by (tier) (rate(cascade_requests_total{{outcome!="ok"}}[5m])) / sum by (tier) '
         f"(rate(cascade_requests_total[5m])) > {ERROR_RATIO} and sum by (tier) "
         f"(rate(cascade_requests_total[5m])) > {ERROR_MIN_RPS}", "5m", "warning",
         "Tier {{ $labels.tier }} fails {{ $value | humanizePercentage }} of its requests",
         f"More than {ERROR_RATIO:.0%} of the tier's requests over 5 minutes ended in a backend error (502/503/504 "
         "or an error event). cascade_backend_errors_total{kind} says which fault."),
    Rule("CascadeTTFTHigh",
         f"histogram_quantile(0.99, sum by (tier, le) (rate(cascade_ttft_seconds_bucket[5m]))) > {TTFT_P99_SLO_S}",
         "10m", "warning", "Tier {{ $labels.tier }} TTFT p99 is {{ $value | humanizeDuration }}",
         f"Streams' time to first token on the tier, p99 over 5 minutes, is above {TTFT_P99_SLO_S:g} s: its "
         "engines queue (cascade_engine_queue_requests) or the tier needs more replicas."),
    # Open (2) and half-open (1) alternate while probes fail; a breaker left half-open by a quiet tier is no fault.
    Rule("CascadeBreakerOpen", "max_over_time(cascade_replica_breaker_state[2m]) == 2 and "
         "min_over_time(cascade_replica_breaker_state[2m]) >= 1", "3m", "warning",
         "Replica {{ $labels.tier }}/{{ $labels.replica }} has been benched for 5 minutes",
         "Its circuit breaker opened and has not closed since, for 5 minutes (every probe failed): the engine is "
         "faulty or gone; its tier serves on its other replicas."),
    Rule("CascadeReplicaDown", "cascade_replica_health_state == 2", "5m", "warning",
         "Replica {{ $labels.tier }}/{{ $labels.replica }} fails its health checks",
         "Background health checks ([gateway.health]) have marked the engine down for 5 minutes: it gets no "
         "requests."),
    Rule("CascadeEngineLoadStale", "cascade_engine_load_fresh == 0", "10m", "info",
         "Engine load of {{ $labels.tier }}/{{ $labels.backend }} is not being read",
         "The gateway cannot read the SGLang engine's /metrics (started without --enable-metrics, or unreachable): "
         "load-reactive routing counts this gateway's own requests only."),
    Rule("CascadeRedisDown", "cascade_redis_up == 0", "1m", "critical",
         "Gateway {{ $labels.instance }} cannot reach Redis",
         "The shared limits' Redis does not answer: with failure = open each gateway enforces its own limits "
         "(a key may get N times its limit); with failure = closed requests get 503."),
    Rule("CascadeRedisFailingClosed", "sum by (instance) (rate(cascade_redis_fail_closed_total[5m])) > 0", "1m",
         "critical", "Gateway {{ $labels.instance }} refuses requests because Redis does not answer",
         "[gateway.redis] failure = closed: requests get 503 limits_unavailable while Redis is unreachable."),
    Rule("CascadeRedisSettlesDropped", "increase(cascade_redis_settles_dropped_total[15m]) > 0", "0m", "warning",
         "Gateway {{ $labels.instance }} dropped token settles",
         "Token corrections Redis did not take: keys' token buckets keep their reservations instead of their bills "
         "(keys are limited more than they should be) until Redis answers again."),
    Rule("CascadeKeyOverLimit",
         f"sum by (key, limit) (rate(cascade_key_rate_limited_total[10m])) * 60 > {KEY_429_PER_MIN:g}", "10m",
         "info", "Key {{ $labels.key }} is over its {{ $labels.limit }} limit",
         f"The key got more than {KEY_429_PER_MIN:g} 429 a minute for 10 minutes ({{{{ $value }}}} a minute): "
         "raise its limit or ask its owner to slow down."),
    Rule("CascadeKeyNearBudget", "sum by (key) (increase(cascade_key_budget_downgraded_total[15m])) > 0", "0m",
         "info", "Key {{ $labels.key }} is near its budget",
         "It passed downgrade_at of its budget: its requests are served as its downgrade_to asks until the period "
         "resets; at the budget they get 429 (CascadeKeyOverLimit, limit budget)."),
    Rule("CascadeKeyBudgetNearlySpent",
         f"max by (key) (cascade_key_budget_spent) / max by (key) (cascade_key_budget) > {BUDGET_SPENT_SHARE:g}", "0m",
         "info", "Key {{ $labels.key }} has spent {{ $value | humanizePercentage }} of its budget",
         "Spent and reserved this period: at its budget the key's requests get 429 insufficient_quota until the "
         "period resets. Raise its budget, or set downgrade_at so that it is served more cheaply first."),
    Rule("CascadeRouterOutOfDomain",
         f"sum(rate(cascade_router_out_of_domain_total[30m])) / sum(rate(cascade_router_decision_seconds_count"
         f"[30m])) > {OUT_OF_DOMAIN_SHARE}", "30m", "info",
         "{{ $value | humanizePercentage }} of routed prompts are unlike the router's training data",
         "The learned router routes them by the heuristic: traffic has drifted from what it was trained on; label "
         "recent traffic and retrain (cascade optimize drift)."),
    Rule("CascadeDegradedServing",
         f"sum(rate(cascade_degraded_requests_total[10m])) / sum(rate(cascade_requests_total[10m])) > "
         f"{DEGRADED_SHARE}", "15m", "warning",
         "{{ $value | humanizePercentage }} of requests are served below their quality hint",
         "Load-reactive routing keeps moving requests to cheaper operating points: the ladder is short of capacity "
         "for this load (replan with cascade optimize plan, or add replicas)."),
)


def rule_groups(rules: tuple[Rule, ...] = RULES) -> dict[str, Any]:
    """The rule file's content: one group."""
    return {"groups": [{"name": GROUP, "rules": [
        {"alert": r.alert, "expr": r.expr, "for": r.for_, "labels": {"severity": r.severity, **r.labels},
         "annotations": {"summary": r.summary, "description": r.description}} for r in rules]}]}


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML of dicts, lists, strings and numbers; every string double-quoted (a JSON string is a valid
    YAML double-quoted scalar), so no value is misread as a number, a boolean or a comment."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{key}:\n{to_yaml(item, indent + 2)}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for item in value:
            text = to_yaml(item, indent + 2) if isinstance(item, dict | list) and item else f"{pad}  {_scalar(item)}"
            lines.append(f"{pad}- {text[indent + 2:]}")
        return "\n".join(lines)
    return pad + _scalar(value)


def _scalar(value: Any) -> str:
    if isinstance(value, dict | list):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(value)


def rules_yaml(rules: tuple[Rule, ...] = RULES) -> str:
    head = ("# Prometheus alerting rules for cascade (rule_files in prometheus.yml). Generated by "
            "cascade/deploy/monitoring/alerts.py:\n# python -m cascade.deploy.monitoring OUT. What each alert means: "
            "docs/operations.md, \"Dashboards and alerts\".\n")
    return head + to_yaml(rule_groups(rules)) + "\n"
