"""A readable Markdown report and a PNG (Pareto front + allocation) for a plan; the drift check's
report (cascade/optimizer/drift.py) for a terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cascade.plan import OperatingPoint, Plan, TierDeployment


def _replicas(d: TierDeployment) -> str:
    sets = d.sets()
    return " + ".join(f"{s.count}x TP{s.tp}" + (f"xPP{s.pp}" if s.pp > 1 else "") for s in sets)


def planned_point(plan: Plan) -> OperatingPoint | None:
    """The operating point the deployment was sized for: the one at the planner's quality target (`balanced`)."""
    target = plan.planner.quality_target if plan.planner else None
    points = [p for p in plan.operating_points if p.hint == "balanced"]
    points += [p for p in plan.operating_points if target is not None and p.quality_target == round(target, 4)]
    return points[0] if points else None


def slowest_tier(plan: Plan) -> TierDeployment | None:
    timed = [d for d in plan.deployment if d.predicted_p95_latency_s is not None]
    return max(timed, key=lambda d: d.predicted_p95_latency_s or 0.0) if timed else None


def binding_tier(plan: Plan) -> TierDeployment | None:
    """The tier furthest into the SLO that binds it (the highest predicted_slo_scale); None without SLO bounds."""
    scaled = [d for d in plan.deployment if d.predicted_slo_scale is not None]
    return max(scaled, key=lambda d: d.predicted_slo_scale or 0.0) if scaled else None


BOUND_NAMES = {"ttft": "TTFT", "e2e": "end-to-end"}


def bound_s(plan: Plan, d: TierDeployment) -> float | None:
    """The SLO in seconds that binds tier `d` (None without the plan's `[slo] ttft_s` / `e2e_s`)."""
    info = plan.planner
    if info is None or d.binding_slo is None:
        return None
    return info.ttft_slo_s if d.binding_slo == "ttft" else info.e2e_slo_s


def tier_slos(plan: Plan) -> dict[str, dict[str, Any]] | None:
    """Per tier: the SLO that binds it, that bound (s) and its p95 over it; None without SLO bounds."""
    if plan.predicted_slo_scale is None:
        return None
    return {d.tier: {"binding_slo": d.binding_slo, "bound_s": bound_s(plan, d), "slo_scale": d.predicted_slo_scale}
            for d in plan.deployment}


def latency_line(plan: Plan) -> str:
    """Both latencies, named: a tier's p95 is one hop's queue + generation, the end-to-end p95 is a request's whole
    way through the ladder. They differ a lot when the slowest tier answers few requests. With SLO bounds, the worst
    tier's SLO scale too, which the allocation then minimizes instead of the slowest p95."""
    slow, point, binding = slowest_tier(plan), planned_point(plan), binding_tier(plan)
    parts = []
    if binding is not None and binding.binding_slo is not None:
        parts.append(f"worst SLO scale {_fmt(plan.predicted_slo_scale)} (`{binding.tier}`, p95 over its "
                     f"{BOUND_NAMES[binding.binding_slo]} bound {_fmt(bound_s(plan, binding))} s; the allocation "
                     "minimizes this)")
    if slow is not None:
        minimized = "" if binding is not None else "; the allocation minimizes this"
        parts.append(f"slowest tier p95 {_fmt(slow.predicted_p95_latency_s)} s (`{slow.tier}`, the requests it "
                     f"answers{minimized})")
    if point is not None and point.predicted_e2e_p95_latency_s is not None:
        parts.append(f"end-to-end p95 {_fmt(point.predicted_e2e_p95_latency_s)} s (every request, hint "
                     f"`{point.hint}`, what a client sees)")
    return "; ".join(parts)


def allocation_reasons(plan: Plan) -> dict[str, str]:
    """One line per tier: its load, what one replica of the chosen shape serves, and why this shape and count."""
    slow = binding_tier(plan) or slowest_tier(plan)
    return {d.tier: _reason(d, d is slow) + _held_to(plan, d) for d in plan.deployment}


def _held_to(plan: Plan, d: TierDeployment) -> str:
    """Which SLO bound the tier's p95 is held to, and how far into it the plan predicts it ("" without bounds)."""
    bound = bound_s(plan, d)
    if d.binding_slo is None or bound is None:
        return ""
    why = ("a vote streams its answer once decided, so its first token is its end" if d.binding_slo == "ttft" else
           "a direct answer streams as it decodes; its first token is not simulated")
    return (f"; held to the {BOUND_NAMES[d.binding_slo]} SLO ({_fmt(bound)} s: {why}): predicted p95 at "
            f"{_fmt(d.predicted_slo_scale)} of it")


def _reason(d: TierDeployment, slowest: bool) -> str:
    if d.gpus == 0:
        return f"{d.model or d.tier}: no GPUs (no request reaches it at the planned mix)"
    rate, capacity = d.arrival_rate_rps, d.capacity_rps
    load = "" if rate is None else f"{_fmt(rate)} req/s arrive; "
    per_replica = f" ({_fmt(capacity / d.replicas)} req/s each)" if capacity and d.replicas else ""
    serves = "" if capacity is None else f" serve up to {_fmt(capacity)} req/s{per_replica}"
    busy = f", {rate / capacity:.0%} busy" if rate is not None and capacity else ""
    p95 = "" if d.predicted_p95_latency_s is None else f"; predicted p95 {_fmt(d.predicted_p95_latency_s)} s"
    if d.binding_slo is not None:
        why = ("the tier furthest into its SLO, whose p95 over its bound the allocation minimizes (the worst tier's "
               "SLO scale is its objective)" if slowest else "its SLO scale stays within the worst tier's")
    else:
        why = ("the slowest tier, whose p95 the allocation minimizes (the worst tier's p95 is its objective)"
               if slowest else "its p95 stays within the slowest tier's")
    light = rate is not None and capacity and rate / capacity < 0.5
    trade = (" (lightly loaded: a wider shape decodes each request faster, and fewer replicas still keep up)"
             if light else " (loaded: enough replicas to keep queues short)" if rate is not None and capacity else "")
    return (f"{d.model or d.tier}: {load}{_replicas(d)} on {d.gpus} GPU(s){serves}{busy}{p95}. {d.gpus} GPU(s): "
            f"{why}; {_replicas(d)}: of the shapes on {d.gpus} GPU(s), the lowest predicted p95 at this rate{trade}")


def markdown(plan: Plan, problem_path: str = "") -> str:
    info = plan.planner
    lines = ["# cascade plan", ""]
    if problem_path:
        lines.append(f"Problem: `{problem_path}`  ")
    total = sum(d.gpus for d in plan.deployment)
    lines.append(f"Cluster: {total} x {plan.gpu} ({plan.gpus_per_node} per node). Routing: `{plan.routing}` "
                 + ("(judge-score acceptance per tier, cumulative load)." if plan.routing == "cascade"
                    else "(difficulty thresholds, one tier per request)."))
    if info is not None:
        lines += [
            "",
            f"Objective: `{info.objective}`, J = L + mu * max(0, (q_min - Q) / (z1 - z2)) with q_min = "
            f"{info.quality_target:g}, mu = {info.mu:g}, z1 = {info.quality_utopia:.4f} (all on the top tier), "
            f"z2 = {info.quality_nadir:.4f} (all on tier 0). J = {info.objective_value:.3f} after "
            f"{info.rounds} round(s), solved in {info.solve_time_s:.2f} s, at {info.rate_rps:g} req/s.",
            f"Latencies are p{info.slo_percentile:g} predictions of the `{info.latency_model}` model "
            + ("(measured step costs)." if info.latency_model == "profile" else
               "(roofline estimates for shapes without a measured profile)."),
        ]
        lines += [f"Tier `{tier}` plans TP1 with the measured profile `{path}`." for tier, path in
                  info.shipped_profiles.items()]
        if info.ttft_slo_s is not None and info.e2e_slo_s is not None:
            lines.append(f"L compares tiers in SLO scale (p95 over the bound that binds the tier: TTFT "
                         f"{info.ttft_slo_s:g} s for a tier that votes, end-to-end {info.e2e_slo_s:g} s otherwise) "
                         f"times {info.e2e_slo_s:g} s; worst scale {_fmt(plan.predicted_slo_scale)}.")
    scaled = plan.predicted_slo_scale is not None
    lines += ["", "## Deployment", "",
              "| tier | model | GPUs | replicas | branches (N, M) | rate (req/s) | capacity (req/s) | p95 (s) |"
              + (" SLO | scale |" if scaled else ""),
              "|---|---|---|---|---|---|---|---|" + ("---|---|" if scaled else "")]
    for d in plan.deployment:
        width = f"({d.branches}, {d.branches_to_finish}" + (f", first {d.first_wave})" if d.first_wave else ")")
        slo = f" {d.binding_slo} {_fmt(bound_s(plan, d))} s | {_fmt(d.predicted_slo_scale)} |" if scaled else ""
        lines.append(f"| {d.tier} | {d.model} | {d.gpus} | {_replicas(d)} | {width} | "
                     f"{_fmt(d.arrival_rate_rps)} | {_fmt(d.capacity_rps)} | {_fmt(d.predicted_p95_latency_s)} |"
                     + slo)
    if info is not None and info.width_trials:
        lines += ["", f"## Reasoning widths tried ({len(info.width_trials)} plans, coordinate descent; lowest J kept)",
                  "", "| widths (N, M) per tier | J | p95 (s) | quality |", "|---|---|---|---|"]
        lines += [f"| {' '.join(f'({n}, {m})' for n, m in t.widths)} | {t.objective:.3f} | {t.latency_s:.2f} | "
                  f"{t.quality:.4f} |" for t in sorted(info.width_trials, key=lambda t: t.objective)]
    lines += ["", "Why each tier got its GPUs:", "", *(f"- `{t}` {why}" for t, why in allocation_reasons(plan).items())]
    if latency := latency_line(plan):
        lines += ["", f"Latency: {latency}."]
    lines += ["", "## Operating points", "",
              "| hint | thresholds | quality (target) | tier shares | worst-tier p95 (s) | end-to-end p95 (s) "
              "| throughput (req/s) |", "|---|---|---|---|---|---|---|"]
    for p in plan.operating_points:
        shares = " / ".join(f"{x:.0%}" for x in p.tier_fractions)
        lines.append(f"| {p.hint} | {', '.join(f'{t:.2f}' for t in p.thresholds)} | {_fmt(p.predicted_quality)} "
                     f"({_fmt(p.quality_target)}) | {shares} | {_fmt(p.predicted_p95_latency_s)} | "
                     f"{_fmt(p.predicted_e2e_p95_latency_s)} | {_fmt(p.predicted_throughput_rps)} |")
    lines += ["", f"## Latency-quality front ({len(plan.pareto_front)} points, joint deployment per point)", "",
              "| thresholds | p95 (s) | quality |", "|---|---|---|"]
    lines += [f"| {', '.join(f'{t:.2f}' for t in p.thresholds)} | {p.latency_s:.2f} | {p.quality:.4f} |"
              for p in plan.pareto_front]
    return "\n".join(lines) + "\n"


def drift_text(report: dict[str, Any]) -> str:
    """The verdict, one line per check with its numbers, the reasons, and the re-plan if any."""
    w = report["window"]
    lines = [f"verdict: {report['verdict']} ({w['records']} requests over {w['span_s']:g} s, window "
             f"{w['window_s']:g} s; {w['malformed_lines']} malformed line(s), {w['unknown_tier_records']} of unknown "
             "tiers skipped)"]
    for name, check in report["checks"].items():
        lines.append(f"  {name:9s} {check['status']:7s} {check['note'] or _check_numbers(name, check)}")
    if report["reasons"]:
        lines += ["reasons:", *(f"  - {r['check']}: {r['detail']}" for r in report["reasons"])]
    replan = report.get("replan")
    if replan:
        old_gpus, new_gpus = (", ".join(f"{t} {g}" for t, g in replan["allocation"][k].items()) for k in ("old", "new"))
        lines.append(f"new plan: {replan['plan']} at {replan['rate_rps']:.4g} req/s (rate from the "
                     f"{replan['rate_source']}); GPUs {old_gpus} -> {new_gpus}")
        lines += [f"  note: {note}" for note in replan["notes"]]
        for hint, pair in replan["hints"].items():
            old, new = (_point_numbers(pair[k]) for k in ("old", "new"))
            lines.append(f"  {hint:9s} {old}  ->  {new}")
    return "\n".join(lines)


def _check_numbers(name: str, c: dict[str, Any]) -> str:
    if name == "rate":
        return f"{c['observed_rps']:.4g} req/s vs {c['planned_rps']:.4g} planned ({c['ratio']:.2f}x)"
    if name == "tier_mix":
        return "; ".join(f"{h} TV {e['tv_distance']:.2f} (n {e['n']})" for h, e in c["hints"].items()
                         if e["tv_distance"] is not None)
    if name == "hint_mix":
        mix = ", ".join(f"{h} {x:.0%}" for h, x in c["observed"].items())
        return f"TV {c['tv_distance']:.2f} of the tier load vs `{c['planned_hint']}` ({mix})"
    if name == "tokens":
        return (f"prompt {c['prompt']['observed_mean']:g} vs {c['prompt']['expected_mean']:g}, completion "
                f"{c['completion']['observed_mean']:g} vs {c['completion']['expected_mean']:g} expected")
    if name == "tier_load":
        return ", ".join(f"{t} {e['observed_rps']:.3g} req/s ({_pct(e['utilization'])} of capacity)"
                         for t, e in c["tiers"].items())
    if name == "latency":
        ratios = [f"{kind[:-1]} {n} {e['ratio']:.2f}x" for kind in ("tiers", "hints") for n, e in c[kind].items()
                  if e["ratio"] is not None]
        return f"p{c['percentile']:g} observed/predicted: " + ", ".join(ratios)
    if name == "domain":
        return (f"{c['observed_share']:.1%} of {c['n']} learned-routed requests out of the router's domain "
                f"(limit {c['limit']:.0%})")
    return ""


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _point_numbers(p: dict[str, float | None] | None) -> str:
    if p is None:
        return "-"
    return (f"p95 {_fmt(p['predicted_p95_latency_s'])} s (e2e {_fmt(p['predicted_e2e_p95_latency_s'])} s), "
            f"{_fmt(p['predicted_throughput_rps'])} req/s, quality {_fmt(p['predicted_quality'])}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def figure(plan: Plan, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (front_ax, alloc_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    front = plan.pareto_front
    front_ax.plot([p.latency_s for p in front], [p.quality for p in front], "o-", ms=3, label="front (joint)")
    labels: dict[tuple[float, float], list[str]] = {}  # hints sharing thresholds share a star
    for point in plan.operating_points:
        if point.predicted_p95_latency_s is not None and point.predicted_quality is not None:
            labels.setdefault((point.predicted_p95_latency_s, point.predicted_quality), []).append(point.hint)
    for (latency, quality), hints in labels.items():
        front_ax.scatter(latency, quality, marker="*", s=120, zorder=3)
        front_ax.annotate(" / ".join(hints), (latency, quality), textcoords="offset points", xytext=(5, 4), fontsize=8)
    if plan.planner is not None:
        front_ax.axhline(plan.planner.quality_target, ls="--", lw=0.8, color="grey", label="q_min")
    front_ax.set_xlabel("worst-tier p95 latency (s)")
    front_ax.set_ylabel("quality")
    front_ax.set_title("latency-quality front")
    front_ax.legend(loc="best", fontsize=8)
    names = [d.tier for d in plan.deployment]
    gpus = [d.gpus for d in plan.deployment]
    bars = alloc_ax.bar(names, gpus, color="tab:blue")
    for bar, d in zip(bars, plan.deployment, strict=True):
        alloc_ax.annotate(_replicas(d), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                          ha="center", va="bottom", fontsize=8)
    alloc_ax.set_ylabel("GPUs")
    alloc_ax.set_title("allocation and parallelism")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
