"""The Grafana dashboard of a cascade deployment, built from one table of panels (`ROWS`).

Every query reads series the gateway exports (cascade/service/metrics.py, engine_load.py) or the Envoy model
picker's (cascade/extproc/metrics.py); tests/deploy/test_monitoring.py fails on a name that is not exported.
Adding a panel is one line in `ROWS`: a title, a unit, and its queries (`rate_by`, `quantiles`, `ratio`, or a
PromQL string). `$__rate_interval` is Grafana's: at least four scrape intervals, so a rate always has two samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RATE = "$__rate_interval"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
UID = "cascade-gateway"
COLUMNS = 3  # panels per line in Grafana (24 grid units wide)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str  # Grafana's unit ids: reqps, ops, percentunit, s, short
    queries: tuple[Query, ...]
    description: str = ""


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


def rate_expr(metric: str, by: str = "", where: str = "", window: str = RATE) -> str:
    """`sum by (BY) (rate(METRIC{WHERE}[WINDOW]))` (a plain `sum` without `by`)."""
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{{{where}}}[{window}]))" if where else \
        f"sum{grouping} (rate({metric}[{window}]))"


def rate_by(metric: str, by: str = "", where: str = "", legend: str = "") -> tuple[Query, ...]:
    """Per-second rate of a counter, summed over gateways, by the labels in `by` (one series each)."""
    default = " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(",")) if by else metric
    return (Query(rate_expr(metric, by, where), legend or default),)


def quantiles(histogram: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.99), where: str = ""
              ) -> tuple[Query, ...]:
    """`histogram_quantile` of a histogram's buckets summed over gateways, one query per quantile."""
    keep = f"{by}, le" if by else "le"
    series = " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(",")) if by else ""
    return tuple(Query(f"histogram_quantile({q}, {rate_expr(histogram + '_bucket', keep, where)})",
                       f"p{q * 100:g} {series}".strip()) for q in qs)


def ratio(numerator: str, denominator: str, legend: str) -> tuple[Query, ...]:
    return (Query(f"{numerator} / {denominator}", legend),)


def gauge(expr: str, legend: str) -> tuple[Query, ...]:
    return (Query(expr, legend),)


def panel(title: str, unit: str, *queries: tuple[Query, ...], description: str = "") -> Panel:
    return Panel(title, unit, tuple(q for group in queries for q in group), description)


_OK = 'outcome="ok"'
_PRUNED = 'event=~"pruned_.*"'
_LAUNCHED = 'event="launched"'

ROWS: tuple[Row, ...] = (
    Row("Tiers", (
        panel("Requests / s by tier and outcome", "reqps", rate_by("cascade_requests_total", "tier, outcome")),
        panel("Error ratio by tier", "percentunit",
              ratio(rate_expr("cascade_requests_total", "tier", 'outcome!="ok"'),
                    rate_expr("cascade_requests_total", "tier"), "{{tier}}"),
              description="Requests that ended in a backend error (502/503/504 or an error event) over all"),
        panel("Backend errors / s by tier and kind", "ops", rate_by("cascade_backend_errors_total", "tier, kind")),
        panel("TTFT by tier (streams)", "s", quantiles("cascade_ttft_seconds", "tier")),
        panel("TPOT by tier (streams)", "s", quantiles("cascade_tpot_seconds", "tier")),
        panel("End-to-end latency by tier", "s", quantiles("cascade_request_latency_seconds", "tier")),
        panel("In flight by tier", "short", gauge("sum by (tier) (cascade_tier_in_flight_requests)", "{{tier}}"),
              gauge("sum (cascade_in_flight_requests)", "gateway")),
        panel("Escalations / s by tier", "ops", rate_by("cascade_escalations_total", "tier"),
              description="Cascade mode: answers not accepted on a tier, asked again on the next"),
        panel("Fallbacks / s", "ops", rate_by("cascade_tier_fallbacks_total", "from_tier, to_tier",
                                              legend="{{from_tier}} -> {{to_tier}}"),
              description="Route mode: requests answered on another tier because theirs failed"),
        panel("Output and decode tokens / s by tier", "short",
              rate_by("cascade_output_tokens_total", "tier", legend="answered {{tier}}"),
              rate_by("cascade_decode_tokens_total", "tier", legend="decoded {{tier}}"),
              description="Decoded: every branch's tokens, pruned and stopped ones included"),
        panel("Client errors / s by status", "ops", rate_by("cascade_client_errors_total", "status"),
              rate_by("cascade_client_disconnects_total", "tier", legend="disconnect {{tier}}")),
        panel("Cost / s by tier", "short", rate_by("cascade_cost_total", "tier"),
              description="[tiers.price] currency units: every token processed, branches and escalated drafts too"),
    )),
    Row("Reasoning branches", (
        panel("Branch events / s by tier", "ops", rate_by("cascade_branches_total", "tier, event")),
        panel("Branch fan-out (launched per answer)", "short",
              ratio(rate_expr("cascade_branches_total", "tier", _LAUNCHED),
                    rate_expr("cascade_requests_total", "tier", _OK), "{{tier}}")),
        panel("Pruned share of launched branches", "percentunit",
              ratio(rate_expr("cascade_branches_total", "tier", _PRUNED),
                    rate_expr("cascade_branches_total", "tier", _LAUNCHED), "{{tier}}")),
    )),
    Row("API keys", (
        panel("Requests / s by key", "reqps", rate_by("cascade_key_requests_total", "key")),
        panel("Tokens billed / s by key", "short", rate_by("cascade_key_tokens_total", "key, direction")),
        panel("Limits hit (429) / s by key", "ops", rate_by("cascade_key_rate_limited_total", "key, limit")),
        panel("Cost / s by key", "short", rate_by("cascade_key_cost_total", "key")),
        panel("Budget spent this period by key", "short", gauge("max by (key) (cascade_key_budget_spent)", "{{key}}"),
              description="Spent and reserved in the budget's current period ([[gateway.keys]] budget)"),
        panel("Budget used this period by key", "percentunit",
              ratio("max by (key) (cascade_key_budget_spent)", "max by (key) (cascade_key_budget)", "{{key}}"),
              description="Share of the key's budget spent and reserved this period: at 100% its requests get 429"),
        panel("Budget downgrades / s by key", "ops", rate_by("cascade_key_budget_downgraded_total", "key"),
              description="Requests served at the key's downgrade_to because it passed downgrade_at of its budget"),
    )),
    Row("Load", (
        panel("Tier pressure (latency / SLO)", "short", gauge("max by (tier) (cascade_tier_pressure)", "{{tier}}"),
              description="Load-reactive routing ([routing.load]): 1 = at the SLO; pressed tiers shed named hints"),
        panel("Degraded requests / s", "ops", rate_by("cascade_degraded_requests_total", "requested, served",
                                                      legend="{{requested}} -> {{served}}")),
        panel("Engine queue and running by tier", "short",
              gauge("sum by (tier) (cascade_engine_queue_requests)", "queued {{tier}}"),
              gauge("sum by (tier) (cascade_engine_running_requests)", "running {{tier}}"),
              description="Read from the SGLang engines' /metrics (every client's requests, not only ours)"),
        panel("Engine KV use and TTFT by tier", "short",
              gauge("max by (tier) (cascade_engine_token_usage)", "KV use {{tier}}"),
              gauge("max by (tier) (cascade_tier_engine_ttft_seconds)", "engine TTFT s {{tier}}")),
        panel("Engine load readings", "short",
              gauge("min by (tier) (cascade_engine_load_fresh)", "fresh {{tier}}"),
              rate_by("cascade_engine_load_poll_failures_total", "tier", legend="poll failures/s {{tier}}")),
    )),
    Row("Replicas", (
        panel("Breaker state by replica (2 open)", "short",
              gauge("max by (tier, replica) (cascade_replica_breaker_state)", "{{replica}}")),
        panel("Breaker openings and failovers / s", "ops",
              rate_by("cascade_replica_breaker_opened_total", "tier, replica", legend="opened {{replica}}"),
              rate_by("cascade_backend_retries_total", "tier", legend="failover {{tier}}")),
        panel("Health by replica (2 down)", "short",
              gauge("max by (tier, replica) (cascade_replica_health_state)", "{{replica}}")),
        panel("Outstanding requests by replica", "short",
              gauge("sum by (tier, replica) (cascade_replica_outstanding_requests)", "{{replica}}")),
        panel("Prefix cache: cached share of prompt tokens", "percentunit",
              ratio(rate_expr("cascade_cached_prompt_tokens_total", "tier"),
                    rate_expr("cascade_upstream_prompt_tokens_total", "tier"), "{{tier}}"),
              description="As the engines report it (usage.prompt_tokens_details.cached_tokens)"),
        panel("Replica spills / s (over the load bound)", "ops", rate_by("cascade_replica_spills_total", "tier")),
    )),
    Row("Router", (
        panel("Routing decision latency", "s", quantiles("cascade_router_decision_seconds", qs=(0.5, 0.99, 0.999))),
        panel("Out-of-domain share", "percentunit",
              ratio(rate_expr("cascade_router_out_of_domain_total"),
                    rate_expr("cascade_router_decision_seconds_count"), "out of domain"),
              description="Prompts the learned router flagged as unlike its training data (routed by the heuristic)"),
    )),
    Row("Shared limits (Redis)", (
        panel("Redis up", "short", gauge("min (cascade_redis_up)", "up (min over gateways)")),
        panel("Redis failures / s by call", "ops", rate_by("cascade_redis_errors_total", "op", legend="error {{op}}"),
              rate_by("cascade_redis_fail_open_total", "op", legend="fail open {{op}}"),
              rate_by("cascade_redis_fail_closed_total", "op", legend="fail closed {{op}}")),
        panel("Token settles dropped / s", "ops", rate_by("cascade_redis_settles_dropped_total")),
    )),
    Row("Envoy model picker (cascade extproc)", (
        panel("Picker decisions / s by tier", "reqps", rate_by("cascade_extproc_decisions_total", "tier"),
              rate_by("cascade_extproc_gateway_requests_total", legend="to the gateway")),
        panel("Picker refusals / s by status", "ops", rate_by("cascade_extproc_refusals_total", "status")),
        panel("Picker decision latency", "s", quantiles("cascade_extproc_decision_seconds")),
    )),
)


def expressions() -> list[str]:
    """Every query of the dashboard, in order."""
    return [q.expr for row in ROWS for p in row.panels for q in p.queries]


def grafana(rows: tuple[Row, ...] = ROWS) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (import it, or provision it; its data source is a variable)."""
    panels: list[dict[str, Any]] = []
    y = 0
    width, height = 24 // COLUMNS, 8
    for row in rows:
        panels.append({"type": "row", "title": row.title, "id": len(panels) + 1, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        y += 1
        for i, p in enumerate(row.panels):
            panels.append({
                "type": "timeseries", "title": p.title, "id": len(panels) + 1, "description": p.description,
                "datasource": DATASOURCE,
                "gridPos": {"h": height, "w": width, "x": (i % COLUMNS) * width, "y": y + (i // COLUMNS) * height},
                "fieldConfig": {"defaults": {"unit": p.unit, "min": 0, "custom": {"lineWidth": 1, "fillOpacity": 0,
                                                                                  "spanNulls": True}},
                                "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                            "tooltip": {"mode": "multi", "sort": "desc"}},
                "targets": [{"datasource": DATASOURCE, "expr": q.expr, "legendFormat": q.legend, "range": True,
                             "refId": chr(ord("A") + k)} for k, q in enumerate(p.queries)],
            })
        y += -(-len(row.panels) // COLUMNS) * height
    return {
        "title": "cascade gateway", "uid": UID, "tags": ["cascade", "llm", "gateway"], "editable": True,
        "description": "Generated by cascade/deploy/monitoring (python -m cascade.deploy.monitoring OUT): edit "
                       "the generator, not this file",
        "schemaVersion": 39, "version": 1, "refresh": "30s", "timezone": "browser", "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "options": []}]},
        "annotations": {"list": []},
        "panels": panels,
    }
