"""A readable Markdown report and a PNG (Pareto front + allocation) for a plan."""

from __future__ import annotations

from pathlib import Path

from cascade.plan import Plan, TierDeployment


def _replicas(d: TierDeployment) -> str:
    sets = d.sets()
    return " + ".join(f"{s.count}x TP{s.tp}" + (f"xPP{s.pp}" if s.pp > 1 else "") for s in sets)


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
            + ("(measured step costs from `cascade profile`)." if info.latency_model == "profile" else
               "(roofline estimates for tiers without a measured profile)."),
        ]
    lines += ["", "## Deployment", "", "| tier | model | GPUs | replicas | rate (req/s) | capacity (req/s) | p95 (s) |",
              "|---|---|---|---|---|---|---|"]
    for d in plan.deployment:
        lines.append(f"| {d.tier} | {d.model} | {d.gpus} | {_replicas(d)} | {_fmt(d.arrival_rate_rps)} | "
                     f"{_fmt(d.capacity_rps)} | {_fmt(d.predicted_p95_latency_s)} |")
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
    front_ax.legend(fontsize=8)
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
