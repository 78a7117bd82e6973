"""The seven checks of `cascade optimize drift` and their thresholds (`Settings`): each compares one
aspect of a traffic window with what the plan predicted, returns its part of the report and appends a
reason for each finding that drifted. cascade/optimizer/drift.py says what each check compares and
which keys its part of the report has.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cascade.errors import ConfigError
from cascade.optimizer.traffic import BYPASS, Columns, Window
from cascade.plan import OperatingPoint, Plan

OK, DRIFT, SKIPPED = "ok", "drift", "skipped"
Check = dict[str, Any]
Reasons = list[dict[str, str]]


@dataclass(frozen=True)
class Settings:
    rate_band: float = 0.25
    tier_mix_tv: float = 0.15
    hint_mix_tv: float = 0.15
    tokens_band: float = 0.25
    latency_margin: float = 0.25
    out_of_domain_share: float = 0.05
    min_requests: int = 50

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not value > 0 or not math.isfinite(value):
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive number, got {value}")
        if self.rate_band >= 1 or self.tokens_band >= 1:
            raise ConfigError("--rate-band and --tokens-band are fractions below 1 (0.25 means ±25%)")
        if self.out_of_domain_share >= 1:
            raise ConfigError("--out-of-domain-share is a fraction below 1 (0.05 means 5% of routed requests)")


def primary_point(plan: Plan) -> OperatingPoint | None:
    """The point the deployment was sized for: the planner's quality target (`balanced` first)."""
    points = plan.operating_points
    if plan.planner is not None:
        target = plan.planner.quality_target
        matching = [p for p in points if p.quality_target is not None and abs(p.quality_target - target) < 1e-4]
        if matching:
            return next((p for p in matching if p.hint == "balanced"), matching[0])
    return next((p for p in points if p.hint == "balanced"), points[0] if points else None)


def _load(plan: Plan, point: OperatingPoint | None) -> np.ndarray | None:
    """Share of requests each tier processes (route: answers; cascade: reach)."""
    if point is None or len(point.tier_fractions) != len(plan.tiers):
        return None
    return np.asarray(point.tier_fractions, dtype=float)


def _answered(plan: Plan, point: OperatingPoint | None) -> np.ndarray | None:
    load = _load(plan, point)
    if load is None:
        return None
    if plan.routing == "cascade":  # reach r_i: answered by tier i = r_i - r_{i+1}
        load = np.clip(load - np.append(load[1:], 0.0), 0.0, None)
    return load / load.sum() if load.sum() > 0 else None


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())


def _shares(values: np.ndarray) -> str:
    return "/".join(f"{x:.0%}" for x in values)


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def _overall(statuses: list[str]) -> str:
    return DRIFT if DRIFT in statuses else OK if OK in statuses else SKIPPED


def rate(plan: Plan, window: Window, t: Columns, s: Settings, reasons: Reasons) -> Check:
    planned = plan.planner.rate_rps if plan.planner else plan.workload.rate_rps if plan.workload else None
    observed = window.rate_rps
    out: Check = {"status": SKIPPED, "note": None, "observed_rps": _r(observed), "planned_rps": planned, "ratio": None}
    if not planned or observed is None or t.n < s.min_requests:
        out["note"] = ("the plan records no rate" if not planned else
                       f"{t.n} record(s) over {window.span_s:.0f} s: too few to estimate a rate")
        return out
    ratio = observed / planned
    out["ratio"] = _r(ratio)
    out["status"] = DRIFT if abs(ratio - 1) > s.rate_band else OK
    if out["status"] == DRIFT:
        reasons.append({"check": "rate", "detail": f"arrival rate {observed:.3g} req/s is {ratio:.2f}x the plan's "
                        f"{planned:.3g} req/s (band ±{s.rate_band:.0%}, {t.n} requests over {window.span_s:.0f} s)"})
    return out


def tier_mix(plan: Plan, t: Columns, s: Settings, reasons: Reasons) -> Check:
    points = {p.hint: p for p in plan.operating_points}
    hints: dict[str, Check] = {}
    for hint in t.hint_names():
        mask = t.hints == hint
        n = int(mask.sum())
        observed = np.bincount(t.tier[mask], minlength=len(plan.tiers)) / n
        planned = _answered(plan, points.get(hint)) if hint != BYPASS else None
        entry: Check = {"status": SKIPPED, "n": n, "observed": [round(float(x), 4) for x in observed],
                        "planned": None, "tv_distance": None}
        if planned is not None:
            tv = _tv(observed, planned)
            entry.update(planned=[round(float(x), 4) for x in planned], tv_distance=round(tv, 4))
            if n >= s.min_requests:
                entry["status"] = DRIFT if tv > s.tier_mix_tv else OK
            if entry["status"] == DRIFT:
                reasons.append({"check": "tier_mix", "detail": f"hint `{hint}`: tiers answered "
                                f"{_shares(observed)} vs {_shares(planned)} planned (TV {tv:.2f} > "
                                f"{s.tier_mix_tv:g}, n = {n})"})
        hints[hint] = entry
    status = _overall([e["status"] for e in hints.values()])
    note = None if status != SKIPPED else (f"no hint with an operating point has {s.min_requests} requests "
                                           "(--min-requests)")
    return {"status": status, "note": note, "tiers": list(plan.tiers), "hints": hints}


def hint_mix(plan: Plan, t: Columns, s: Settings, reasons: Reasons) -> Check:
    points = {p.hint: p for p in plan.operating_points}
    primary = primary_point(plan)
    shares = {h: float(np.mean(t.hints == h)) for h in t.hint_names()}
    planned = _load(plan, primary)
    out: Check = {"status": SKIPPED, "note": None, "observed": {h: round(x, 4) for h, x in shares.items()},
                  "planned_hint": primary.hint if primary else None, "planned_load": None, "implied_load": None,
                  "tv_distance": None}
    if planned is None or planned.sum() <= 0:
        out["note"] = "the plan has no tier_fractions for its quality target's operating point"
        return out
    implied = np.zeros(len(plan.tiers))
    for hint, share in shares.items():
        load = _load(plan, points.get(hint)) if hint != BYPASS else None
        implied += share * (load if load is not None else t.load[t.hints == hint].mean(axis=0))
    tv = _tv(implied, planned)
    out.update(planned_load=[round(float(x), 4) for x in planned], implied_load=[round(float(x), 4) for x in implied],
               tv_distance=round(tv, 4))
    if t.n < s.min_requests:
        out["note"] = f"{t.n} record(s): fewer than --min-requests {s.min_requests}"
        return out
    out["status"] = DRIFT if tv > s.hint_mix_tv else OK
    if out["status"] == DRIFT:
        mix = ", ".join(f"{h} {x:.0%}" for h, x in shares.items())
        planned_hint = primary.hint if primary else "?"
        reasons.append({"check": "hint_mix", "detail": f"hint mix {mix} loads the tiers "
                        f"{_shares(implied / implied.sum())} vs {_shares(planned / planned.sum())} as planned for "
                        f"`{planned_hint}` (TV {tv:.2f} > {s.hint_mix_tv:g})"})
    return out


def _expected_lengths(plan: Plan, t: Columns) -> tuple[np.ndarray, np.ndarray]:
    """Per record, the prompt and completion tokens the plan expects (NaN: it does not say)."""
    k = len(plan.tiers)
    points = {p.hint: p for p in plan.operating_points}
    w = plan.workload
    prompt, completion = np.full(t.n, np.nan), np.full(t.n, np.nan)
    for i, (hint, tier) in enumerate(zip(t.hints, t.tier, strict=True)):
        point = points.get(hint)
        if point is not None and len(point.mean_prompt_tokens) == k and len(point.mean_output_tokens) == k:
            prompt[i], completion[i] = point.mean_prompt_tokens[tier], point.mean_output_tokens[tier]
        elif w is not None:
            per_tier = w.mean_output_tokens_per_tier
            prompt[i] = w.mean_prompt_tokens
            completion[i] = per_tier[tier] if len(per_tier) == k else w.mean_output_tokens
    return prompt, completion


def _means(observed: np.ndarray, expected: np.ndarray) -> Check:
    o, e = float(observed.mean()), float(expected.mean())
    return {"observed_mean": round(o, 1), "expected_mean": round(e, 1), "ratio": _r(o / e) if e > 0 else None}


def tokens(plan: Plan, t: Columns, s: Settings, reasons: Reasons) -> Check:
    exp_prompt, exp_completion = _expected_lengths(plan, t)
    known = ~np.isnan(exp_prompt)
    n = int(known.sum())
    out: Check = {"status": SKIPPED, "note": None, "n": n, "prompt": None, "completion": None, "tiers": {}}
    if n == 0:
        out["note"] = "the plan records no workload lengths (written before drift checks): re-plan it to compare"
        return out
    out["prompt"] = _means(t.prompt[known], exp_prompt[known])
    out["completion"] = _means(t.completion[known], exp_completion[known])
    for i, name in enumerate(plan.tiers):
        mask = known & (t.tier == i)
        if mask.any():
            out["tiers"][name] = {"n": int(mask.sum()), "prompt": _means(t.prompt[mask], exp_prompt[mask]),
                                  "completion": _means(t.completion[mask], exp_completion[mask])}
    if n < s.min_requests:
        out["note"] = f"{n} record(s) with expected lengths: fewer than --min-requests {s.min_requests}"
        return out
    out["status"] = OK
    for what in ("prompt", "completion"):
        m = out[what]
        if m["ratio"] is not None and abs(m["ratio"] - 1) > s.tokens_band:
            out["status"] = DRIFT
            reasons.append({"check": "tokens", "detail": f"{what} tokens average {m['observed_mean']:g} vs "
                            f"{m['expected_mean']:g} the plan expects for these requests ({m['ratio']:.2f}x, band "
                            f"±{s.tokens_band:.0%}, n = {n})"})
    return out


def tier_load(plan: Plan, window: Window, t: Columns, s: Settings, reasons: Reasons) -> Check:
    rate = window.rate_rps
    deployed = {d.tier: d for d in plan.deployment}
    out: Check = {"status": SKIPPED, "note": None, "tiers": {}}
    if rate is None or not deployed or t.n < s.min_requests:
        out["note"] = "the plan has no deployment" if not deployed else "too few records to estimate a rate"
        return out
    per_request = t.load.mean(axis=0)
    for i, name in enumerate(plan.tiers):
        d = deployed.get(name)
        observed = rate * float(per_request[i])
        capacity = d.capacity_rps if d is not None else None
        entry: Check = {"status": SKIPPED, "observed_rps": _r(observed),
                        "planned_rps": d.arrival_rate_rps if d else None, "capacity_rps": capacity,
                        "utilization": _r(observed / capacity) if capacity else None}
        if capacity:
            entry["status"] = DRIFT if observed > capacity else OK
        if entry["status"] == DRIFT:
            reasons.append({"check": "tier_load", "detail": f"tier `{name}` processes {observed:.3g} req/s, above its "
                            f"capacity {capacity:.3g} req/s (planned {entry['planned_rps']} req/s)"})
        out["tiers"][name] = entry
    out["status"] = _overall([e["status"] for e in out["tiers"].values()])
    return out


def _latency_entry(values: np.ndarray, predicted: float | None, pct: float, s: Settings) -> Check:
    n = len(values)
    observed = float(np.percentile(values, pct)) if n else None
    entry: Check = {"status": SKIPPED, "n": n, "observed_s": _r(observed, 3), "predicted_s": predicted,
                    "ratio": _r(observed / predicted) if observed is not None and predicted else None}
    if predicted and observed is not None and n >= s.min_requests:
        entry["status"] = DRIFT if observed > predicted * (1 + s.latency_margin) else OK
    return entry


def latency(plan: Plan, t: Columns, s: Settings, reasons: Reasons) -> Check:
    pct = plan.planner.slo_percentile if plan.planner else 95.0
    deployed = {d.tier: d for d in plan.deployment}
    points = {p.hint: p for p in plan.operating_points}
    tiers, hints = {}, {}
    for i, name in enumerate(plan.tiers):
        d = deployed.get(name)
        tiers[name] = _latency_entry(t.latency[(t.tier == i) & (t.escalations == 0)],
                                     d.predicted_p95_latency_s if d else None, pct, s)
    for hint in t.hint_names():
        point = points.get(hint)
        hints[hint] = _latency_entry(t.latency[t.hints == hint], point.predicted_e2e_p95_latency_s if point else None,
                                     pct, s)
    for kind, entries in (("tier", tiers), ("hint", hints)):
        for name, e in entries.items():
            if e["status"] == DRIFT:
                reasons.append({"check": "latency", "detail": f"{kind} `{name}`: p{pct:g} latency {e['observed_s']:g} s"
                                f" vs {e['predicted_s']:g} s predicted ({e['ratio']:.2f}x > {1 + s.latency_margin:g}x,"
                                f" n = {e['n']})"})
    status = _overall([e["status"] for e in [*tiers.values(), *hints.values()]])
    note = "no tier or hint has both a prediction and --min-requests records" if status == SKIPPED else None
    return {"status": status, "note": note, "percentile": pct, "tiers": tiers, "hints": hints}


def domain(t: Columns, s: Settings, reasons: Reasons) -> Check:
    routed = t.learned_router | t.out_of_domain
    n, flagged = int(routed.sum()), int(t.out_of_domain.sum())
    out: Check = {"status": SKIPPED, "note": None, "n": n, "out_of_domain": flagged, "observed_share": None,
                  "limit": s.out_of_domain_share}
    if n == 0:
        out["note"] = "no request was routed by a learned router"
        return out
    share = flagged / n
    out["observed_share"] = round(share, 4)
    if n < s.min_requests:
        out["note"] = f"{n} requests routed by a learned router, fewer than --min-requests {s.min_requests}"
        return out
    out["status"] = DRIFT if share > s.out_of_domain_share else OK
    if out["status"] == DRIFT:
        reasons.append({"check": "domain", "detail": (
            f"{share:.1%} of {n} routed requests were unlike the router's training prompts (limit "
            f"{s.out_of_domain_share:.0%}): label this traffic (cascade label) and retrain the router")})
    return out
