"""`cascade optimize plan|allocate|drift` (`cascade deploy` is cascade/deploy/cli.py). Only argparse here at import
time: the solvers (highspy, pymoo, matplotlib) load when a command runs, so `cascade --help` stays light."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_optimize_commands(sub: argparse._SubParsersAction) -> None:
    optimize = sub.add_parser("optimize", help="plan routing thresholds and GPU allocation (Cascadia-style)")
    actions = optimize.add_subparsers(dest="optimize_command", required=True, metavar="ACTION")

    plan = actions.add_parser(
        "plan", help="choose thresholds per quality hint and GPUs/TP/PP per tier for a problem.toml",
        description="Bi-level search: pymoo over routing thresholds outside, a simulator-backed parallelism "
        "search and an allocation MILP (HiGHS) inside. Writes plan.json plus a Markdown report, a PNG and "
        "the latency table next to it.",
    )
    plan.add_argument("--spec", required=True, help="problem.toml (cluster, tiers, workload, outcomes, quality)")
    plan.add_argument("--out", required=True, help="plan.json to write (also writes .md, .png, .latency.json)")
    plan.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    plan.add_argument("--no-figure", action="store_true", help="skip the PNG (no matplotlib needed)")
    plan.set_defaults(func=_plan)

    allocate = actions.add_parser(
        "allocate", help="solve the GPU allocation MILP for a latency table",
        description="latency.json: {\"gpus\": N, \"tiers\": [{\"name\": str, \"latency_s\": {\"<f>\": float}}]}; "
        "a missing f means the tier does not fit on f GPUs. Minimizes the worst tier latency.",
    )
    allocate.add_argument("--table", required=True, help="latency.json")
    allocate.add_argument("--json", action="store_true", help="print {status, latency_s, allocation}")
    allocate.add_argument("--at-most", action="store_true", help="use at most N GPUs (default: exactly N)")
    allocate.add_argument("--solver", choices=["highs", "dp"], default="highs",
                          help="HiGHS MILP (default) or the exact dynamic program")
    allocate.set_defaults(func=_allocate)
    _add_drift(actions)


def _add_drift(actions: argparse._SubParsersAction) -> None:
    drift = actions.add_parser(
        "drift", help="check a plan against recent gateway traffic; optionally re-plan for it",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Reads the last --window-s seconds of the gateway's traffic log ([gateway] traffic_log; the "
        "window ends at the newest record) and compares it with the plan: arrival rate, tier mix per quality hint, "
        "hint mix, token lengths, tier load vs capacity, latency vs predictions. Verdict `ok` or `drift` with the "
        "reasons. Exit 0 either way (3 with --fail-on-drift and drift); 2 on errors. With --spec/--out, re-plans "
        "with the observed rate and token lengths and compares old and new predictions per hint.\n\n"
        "--json keys: verdict, reasons [{check, detail}], window {start_ts, end_ts, window_s, span_s, records, "
        "malformed_lines, unknown_tier_records}, settings, checks {rate, tier_mix, hint_mix, tokens, tier_load, "
        "latency, domain: each {status: ok|drift|skipped, note, ...}}, replan (null, or {plan, report, rate_rps, "
        "rate_source, length_scale, notes, allocation {old, new}, hints {<hint>: {old, new}}}). Every key is "
        "documented in cascade/optimizer/drift.py and cascade/optimizer/replan.py.",
    )
    drift.add_argument("--plan", required=True, help="plan.json the gateway serves")
    drift.add_argument("--traffic", required=True, help="the gateway's traffic log (JSONL), e.g. logs/traffic.jsonl")
    drift.add_argument("--window-s", type=float, default=3600.0, help="judge the last this many seconds (default 3600)")
    drift.add_argument("--json", action="store_true", help="print the report as JSON")
    drift.add_argument("--fail-on-drift", action="store_true", help="exit 3 when the verdict is drift")
    drift.add_argument("--rate-band", type=float, default=0.25,
                       help="drift when the arrival rate is outside (1 ± this) x the plan's (default 0.25)")
    drift.add_argument("--tier-mix-tv", type=float, default=0.15,
                       help="drift when a hint's tier shares are this far (total variation) from its point's")
    drift.add_argument("--hint-mix-tv", type=float, default=0.15,
                       help="drift when the hint mix moves the tier load this far (total variation) from the plan's")
    drift.add_argument("--tokens-band", type=float, default=0.25,
                       help="drift when mean prompt or completion tokens are outside (1 ± this) x expected")
    drift.add_argument("--latency-margin", type=float, default=0.25,
                       help="drift when observed latency exceeds the prediction by more than this fraction")
    drift.add_argument("--out-of-domain-share", type=float, default=0.05,
                       help="drift when more than this share of the requests a learned router routed were unlike "
                       "its training prompts (default 0.05; ~0.01 by construction on the traffic it learned)")
    drift.add_argument("--min-requests", type=int, default=50,
                       help="judge a hint, tier or the window only with at least this many records (default 50)")
    drift.add_argument("--spec", help="problem.toml the plan was made from: re-plan with the observed workload")
    drift.add_argument("--out", help="with --spec: the new plan.json to write (and its .md report)")
    drift.set_defaults(func=_drift)


def _drift(args: argparse.Namespace) -> int:
    from cascade.errors import ConfigError
    from cascade.optimizer import drift, report
    from cascade.optimizer.traffic import read_window
    from cascade.plan import load_plan

    if bool(args.spec) != bool(args.out):
        raise ConfigError("--spec and --out go together: the problem to re-plan and the new plan.json to write")
    settings = drift.Settings(rate_band=args.rate_band, tier_mix_tv=args.tier_mix_tv, hint_mix_tv=args.hint_mix_tv,
                              tokens_band=args.tokens_band, latency_margin=args.latency_margin,
                              out_of_domain_share=args.out_of_domain_share, min_requests=args.min_requests)
    plan = load_plan(args.plan)
    window = read_window(args.traffic, args.window_s, len(plan.tiers))
    result = drift.check(plan, window, settings)
    if args.spec:
        import msgspec

        from cascade.optimizer.problem import load_problem
        from cascade.optimizer.replan import replan

        problem, base_dir = load_problem(args.spec)

        def progress(message: str) -> None:
            if not args.json:
                print(message, file=sys.stderr)

        new, summary = replan(plan, result, problem, base_dir, settings.min_requests, progress)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(msgspec.json.format(msgspec.json.encode(new.plan)) + b"\n")
        md = out.with_suffix(".md")
        md.write_text(report.markdown(new.plan, args.spec))
        result["replan"] = summary | {"plan": str(out), "report": str(md)}
    print(json.dumps(result) if args.json else report.drift_text(result))
    return 3 if args.fail_on_drift and result["verdict"] == drift.DRIFT else 0


def _plan(args: argparse.Namespace) -> int:
    import msgspec

    from cascade.optimizer import report
    from cascade.optimizer.milp import table_from_matrix
    from cascade.optimizer.planner import plan_problem
    from cascade.optimizer.problem import load_problem

    problem, base_dir = load_problem(args.spec)
    quiet = args.json

    def progress(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr)

    result = plan_problem(problem, base_dir, progress)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(msgspec.json.format(msgspec.json.encode(result.plan)) + b"\n")
    md, png, table_path = out.with_suffix(".md"), out.with_suffix(".png"), out.with_suffix(".latency.json")
    md.write_text(report.markdown(result.plan, args.spec))
    rates = result.instance.rate_rps * result.instance.fractions(result.primary.ks)
    matrix = [t.latency(r)[0] for t, r in zip(result.tables, rates, strict=True)]
    import numpy as np

    table_path.write_bytes(msgspec.json.encode(table_from_matrix(result.instance.names, np.array(matrix))))
    if not args.no_figure:
        report.figure(result.plan, png)
    primary = result.primary
    reasons = report.allocation_reasons(result.plan)
    summary = {
        "plan": str(out), "report": str(md), "figure": None if args.no_figure else str(png), "table": str(table_path),
        "objective": primary.objective, "latency_s": primary.latency_s, "quality": primary.quality,
        "thresholds": primary.thresholds,
        "allocation": {d.tier: d.gpus for d in result.plan.deployment},
        "widths": {d.tier: [d.branches, d.branches_to_finish] for d in result.plan.deployment},
        "solve_time_s": result.solve_time_s, "latency_model": result.instance.latency_model,
        "shipped_profiles": result.instance.shipped_profiles,
        # `latency_s` is the slowest tier's p95 (the planner's objective); a client sees the end-to-end one.
        "slowest_tier_p95_s": primary.latency_s,
        "slowest_tier": slow.tier if (slow := report.slowest_tier(result.plan)) else None,
        "e2e_p95_s": point.predicted_e2e_p95_latency_s if (point := report.planned_point(result.plan)) else None,
        "allocation_reasons": reasons,
        # With `[slo] ttft_s` / `e2e_s` (else None): the worst tier's p95 over the bound that binds it, which the
        # allocation then minimizes, that tier and its bound; per tier, its bound and scale.
        "slo_scale": result.plan.predicted_slo_scale,
        "binding_tier": binding.tier if (binding := report.binding_tier(result.plan)) else None,
        "binding_slo": binding.binding_slo if binding else None,
        "tier_slos": report.tier_slos(result.plan),
    }
    target = problem.quality.target
    if primary.quality < target - 1e-9:
        print(f"cascade: warning: quality {primary.quality:.4f} misses the target {target:g}: meeting it costs more "
              f"latency than the penalty (mu = {problem.quality.mu:g}); raise [quality] mu to enforce it",
              file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"wrote {out}, {md}, {table_path}" + ("" if args.no_figure else f", {png}"))
        print(f"J = {primary.objective:.3f}: slowest tier p95 {primary.latency_s:.2f} s, "
              f"quality {primary.quality:.4f}, "
              f"thresholds {primary.thresholds}, GPUs {summary['allocation']}"
              + (f", widths (N, M) {summary['widths']}" if any(d.branches > 1 for d in result.plan.deployment) else "")
              + f" ({result.solve_time_s:.2f} s)")
        print(report.latency_line(result.plan))
        for tier, why in reasons.items():
            print(f"  {tier}: {why}")
    return 0


def _allocate(args: argparse.Namespace) -> int:
    from cascade.optimizer.milp import allocation_json, load_table, solve_dp, solve_highs

    table = load_table(args.table)
    matrix = table.matrix()
    exact = not args.at_most
    if args.solver == "dp":
        allocation = solve_dp(matrix, table.gpus, exact)
    else:
        # The dynamic program's answer bounds HiGHS's search; HiGHS's answer is exact regardless.
        bound = solve_dp(matrix, table.gpus, exact)
        allocation = solve_highs(matrix, table.gpus, exact,
                                 upper_bound=bound.latency_s if bound.status == "optimal" else None)
    names = [t.name for t in table.tiers]
    result = allocation_json(names, allocation)
    if args.json:
        print(json.dumps(result))
    elif allocation.status == "optimal":
        print(f"optimal: worst tier latency {allocation.latency_s:.4g} s")
        for name, gpus in zip(names, allocation.gpus, strict=True):
            print(f"  {name:24s} {gpus:4d} GPUs")
    else:
        print("infeasible: no allocation gives every tier a GPU count it fits on" +
              (" within" if args.at_most else " using exactly") + f" {table.gpus} GPUs")
    return 0
