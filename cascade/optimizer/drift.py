"""`cascade optimize drift`: does a plan still fit the traffic the gateway served?

Takes a window of the gateway's traffic log (cascade/optimizer/traffic.py: the last `window_s`
seconds of records, ending at the newest one; malformed lines skipped and counted) and compares it
with what the plan assumed. Each check is `ok`, `drift` or `skipped` (nothing to
compare with: the plan lacks the prediction, or fewer than `min_requests` records to judge by):

rate       arrival rate, (n - 1) / span of the window, vs `planner.rate_rps`: drift outside
           [1 - rate_band, 1 + rate_band] times the plan's.
tier_mix   per quality hint with an operating point: the share of requests each tier answered vs
           the point's `tier_fractions` (a cascade plan's reach converted to answered shares):
           drift when their total-variation distance exceeds tier_mix_tv.
hint_mix   the hint mix, and the load per tier it implies (each hint's planned `tier_fractions`
           weighted by its share; hints without a point, e.g. `bypass`, as observed) vs the load the
           deployment was sized for (the point at the planner's quality target): drift when the
           total-variation distance of the normalized loads exceeds hint_mix_tv.
tokens     mean prompt and completion tokens vs what the plan expects for the same requests (the
           mean of each record's (hint, tier) from its operating point, else the plan's `workload`):
           drift when either ratio is outside [1 - tokens_band, 1 + tokens_band].
tier_load  per tier, requests processed per second (rate x observed load per request) vs the
           deployment's `arrival_rate_rps` and `capacity_rps`: drift above capacity.
latency    observed latency at the plan's SLO percentile (`planner.slo_percentile`, default 95) per
           tier (requests answered without escalation) vs the tier's `predicted_p95_latency_s`, and
           per hint vs the point's `predicted_e2e_p95_latency_s`: drift when observed > predicted x
           (1 + latency_margin).
domain     the share of requests routed by a learned router that it flagged as unlike its training
           prompts (`out_of_domain` in the log, cascade/router/domain.py; ~1% of in-domain traffic by
           construction): drift above out_of_domain_share, i.e. the traffic moved away from what the router
           learned and it should be retrained on outcomes of this traffic. Skipped when no record was routed
           by a learned router.

The report (`--json` prints it; these keys are stable):

    {"verdict": "ok" | "drift",
     "reasons": [{"check": str, "detail": str}],     # one per finding that drifted, with its numbers
     "window": {"start_ts", "end_ts", "window_s", "span_s", "records", "malformed_lines",
                "unknown_tier_records"},              # malformed_lines: over the whole file
     "settings": {"rate_band", "tier_mix_tv", "hint_mix_tv", "tokens_band", "latency_margin", "min_requests"},
     "checks": {   # every check: {"status": "ok" | "drift" | "skipped", "note": str | null, ...}
       "rate": {"observed_rps", "planned_rps", "ratio"},
       "tier_mix": {"tiers": [name], "hints": {hint: {"status", "n", "observed": [share per tier],
                                                      "planned": [...] | null, "tv_distance"}}},
       "hint_mix": {"observed": {hint: share}, "planned_hint", "planned_load": [...], "implied_load": [...],
                    "tv_distance"},
       "tokens": {"n", "prompt": M, "completion": M, "tiers": {tier: {"n", "prompt": M, "completion": M}}},
                 # M = {"observed_mean", "expected_mean", "ratio"}
       "tier_load": {"tiers": {tier: {"status", "observed_rps", "planned_rps", "capacity_rps", "utilization"}}},
       "latency": {"percentile", "tiers": {tier: L}, "hints": {hint: L}},
                 # L = {"status", "n", "observed_s", "predicted_s", "ratio"}
       "domain": {"n", "out_of_domain", "observed_share", "limit"}},
     "replan": null | {...}}                           # with --spec/--out: see cascade/optimizer/replan.py
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from cascade.optimizer import drift_checks
from cascade.optimizer.drift_checks import DRIFT, OK, SKIPPED, Reasons, Settings
from cascade.optimizer.traffic import Columns, Window
from cascade.plan import Plan

# The statuses and thresholds are this command's API too: its callers compare verdicts with DRIFT.
__all__ = ["DRIFT", "OK", "SKIPPED", "Settings", "check"]


def check(plan: Plan, window: Window, settings: Settings) -> dict[str, Any]:
    """The report above for `window` (at least one record) against `plan`."""
    t = Columns(plan, window)
    reasons: Reasons = []
    checks = {
        "rate": drift_checks.rate(plan, window, t, settings, reasons),
        "tier_mix": drift_checks.tier_mix(plan, t, settings, reasons),
        "hint_mix": drift_checks.hint_mix(plan, t, settings, reasons),
        "tokens": drift_checks.tokens(plan, t, settings, reasons),
        "tier_load": drift_checks.tier_load(plan, window, t, settings, reasons),
        "latency": drift_checks.latency(plan, t, settings, reasons),
        "domain": drift_checks.domain(t, settings, reasons),
    }
    recs = window.records
    return {
        "verdict": DRIFT if any(c["status"] == DRIFT for c in checks.values()) else OK,
        "reasons": reasons,
        "window": {"start_ts": recs[0].ts, "end_ts": recs[-1].ts, "window_s": window.window_s,
                   "span_s": round(window.span_s, 3), "records": len(recs), "malformed_lines": window.malformed,
                   "unknown_tier_records": window.unknown_tier},
        "settings": asdict(settings),
        "checks": checks,
        "replan": None,
    }
