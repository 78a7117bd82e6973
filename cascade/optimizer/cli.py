"""`cascade optimize plan|allocate|drift` and `cascade deploy`. Only argparse here at import time: the
solvers (highspy, pymoo, matplotlib) and the engine launcher load when a command runs, so
`cascade --help` stays light."""

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

    deploy = sub.add_parser(
        "deploy", help="launch and supervise the plan's engines and write the gateway config",
        description="Reads plan.json only. Starts the engines (SGLang servers on this node, or one local process "
        "per tier replica; a plan that spans nodes runs this on every node with the same --hosts and that node's "
        "--node), restarts any that dies, writes the cascade.toml that points at them once all are "
        "healthy, and stops them all on Ctrl-C/SIGTERM. With --dry-run, prints the launch commands (GPUs, "
        "ports, node placement) and that cascade.toml instead.",
    )
    deploy.add_argument("--plan", required=True, help="plan.json from `cascade optimize plan`")
    deploy.add_argument("--engine", choices=["sglang", "local"], default="sglang")
    deploy.add_argument("--dry-run", action="store_true", help="print what would run; start nothing")
    deploy.add_argument("--hosts", help="sglang: comma-separated node host names, the same list on every node; "
                        "each node's servers bind its name here and the gateway config points at it, so use names "
                        "or addresses the gateway reaches (a name its own node resolves to loopback, like "
                        "Debian's 127.0.1.1, is not) (default: 127.0.0.1 for a plan on one node; --dry-run of a plan "
                        "that spans nodes: node-0, ...)")
    deploy.add_argument("--node", help="sglang, a plan that spans nodes: this node's name in --hosts; run the "
                        "same command on every node, each with its own --node")
    deploy.add_argument("--base-port", type=int, default=30000, help="first SGLang port on each node")
    deploy.add_argument("--engine-host", metavar="ADDR",
                        help="sglang: the address every SGLang server binds instead (default: 127.0.0.1 on one node "
                        "without --hosts, else each node's name in --hosts); 0.0.0.0 or :: opts in to every "
                        "interface (the gateway config keeps the --hosts names, or 127.0.0.1); another address "
                        "needs a plan on one node, and the gateway config points at it. A non-loopback bind without "
                        "an API key prints a warning")
    deploy.add_argument("--engine-api-key-env", metavar="NAME", default="CASCADE_ENGINE_API_KEY",
                        help="sglang: environment variable holding the engines' API key (default: "
                        "%(default)s). When it is set, every SGLang server gets --api-key with its value and the "
                        "written gateway config's backends carry api_key = the value (cascade.toml cannot read "
                        "the environment; the file is created with mode 0600). Printed commands and --dry-run "
                        "show \"$NAME\" (and ${NAME} in the config), never the value")
    deploy.add_argument("--deterministic", action="store_true",
                        help="sglang: every server gets --enable-deterministic-inference (reproducible branches: "
                        "SGLang then honours each branch's seed, which it ignores otherwise), not only the tiers "
                        "the plan marks `deterministic`; costs throughput (SGLang reports 25-45%% slower)")
    deploy.add_argument("--dp-per-server", action="store_true",
                        help="one SGLang server per tier and node with --dp-size (default: one server per replica)")
    deploy.add_argument("--engine-command", metavar="TEMPLATE",
                        help="local: the command per tier replica, with {port}, {model}, {tier}, {replica}, e.g. "
                        "'cascade fake-server --port {port} --model {model}' (default: `transformers serve` of the "
                        "tier's embedded model)")
    deploy.add_argument("--config-out", help="gateway config to write (default: PLAN.cascade.toml beside the plan)")
    deploy.add_argument("--log-dir", default="logs/deploy", help="one log file per engine")
    deploy.add_argument("--startup-timeout-s", type=float, default=900.0, help="wait this long for each /health")
    deploy.add_argument("--max-restarts", type=int, default=5, help="restarts per engine before giving up on it")
    scale = deploy.add_argument_group(
        "scale-out", "--gateways N writes (or with --dry-run prints) Envoy in front of N gateways and Kubernetes "
        "manifests, and starts nothing (docs/scaling.md)")
    scale.add_argument("--gateways", type=int, metavar="N", help="write OUT/envoy.json, OUT/gateways.sh (the N "
                       "`cascade serve` commands and Envoy) and OUT/k8s/*.json (N replicas)")
    scale.add_argument("--out", metavar="DIR", help="with --gateways: where to write (default: PLAN.scaleout/)")
    scale.add_argument("--gateway-port", type=int, default=8001, help="first gateway port; the N gateways listen on "
                       "127.0.0.1, ports %(default)s, %(default)s+1, ...")
    scale.add_argument("--listen", default="127.0.0.1:8000", metavar="HOST:PORT",
                       help="where Envoy takes the clients (default: %(default)s; 0.0.0.0:8000 for every interface)")
    scale.add_argument("--admin-port", type=int, default=9901, help="Envoy's admin port (bound to 127.0.0.1)")
    scale.add_argument("--image", default="cascade:latest", help="the Deployment's container image")
    scale.add_argument("--max-gateways", type=int, help="the autoscaler's maximum (default: 4 x N)")
    scale.add_argument("--hpa-in-flight", type=int, default=8,
                       help="the autoscaler's target of cascade_in_flight_requests per gateway")
    deploy.set_defaults(func=_deploy)


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
    summary = {
        "plan": str(out), "report": str(md), "figure": None if args.no_figure else str(png), "table": str(table_path),
        "objective": primary.objective, "latency_s": primary.latency_s, "quality": primary.quality,
        "thresholds": primary.thresholds,
        "allocation": {d.tier: d.gpus for d in result.plan.deployment},
        "widths": {d.tier: [d.branches, d.branches_to_finish] for d in result.plan.deployment},
        "solve_time_s": result.solve_time_s, "latency_model": result.instance.latency_model,
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
        print(f"J = {primary.objective:.3f}: p95 {primary.latency_s:.2f} s, quality {primary.quality:.4f}, "
              f"thresholds {primary.thresholds}, GPUs {summary['allocation']}"
              + (f", widths (N, M) {summary['widths']}" if any(d.branches > 1 for d in result.plan.deployment) else "")
              + f" ({result.solve_time_s:.2f} s)")
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


def _deploy(args: argparse.Namespace) -> int:
    from cascade.engines import sglang_launch
    from cascade.errors import ConfigError
    from cascade.optimizer import deploy
    from cascade.plan import load_plan

    plan = load_plan(args.plan)
    if args.gateways is not None:
        return _scale_out(args)
    if args.engine_command and args.engine != "local":
        raise ConfigError("--engine-command applies to --engine local")
    if args.engine_host is not None and args.engine != "sglang":
        raise ConfigError("--engine-host applies to --engine sglang (local engines bind 127.0.0.1)")
    if args.deterministic and args.engine != "sglang":
        raise ConfigError("--deterministic applies to --engine sglang (its --enable-deterministic-inference)")
    key_env = args.engine_api_key_env
    api_key = deploy.engine_api_key(key_env) if args.engine == "sglang" else ""
    if args.engine == "sglang" and args.dry_run:
        hosts = [h.strip() for h in args.hosts.split(",") if h.strip()] if args.hosts else None
        launch = sglang_launch.launch_plan(deploy.with_card_parsers(plan), hosts=hosts, base_port=args.base_port,
                                           dp_per_server=args.dp_per_server, engine_host=args.engine_host,
                                           api_key=f"${{{key_env}}}" if api_key else "",  # never the value
                                           deterministic=args.deterministic)
        _warn(deploy.exposure_warning({s.listen for s in launch.servers}, bool(api_key), key_env))
        print(sglang_launch.render(launch, key_env if api_key else ""))
        return 0
    if args.node and args.engine != "sglang":
        raise ConfigError("--node applies to --engine sglang")
    if args.engine == "sglang":
        hosts = [h.strip() for h in args.hosts.split(",") if h.strip()] if args.hosts else None
        engines, config = deploy.sglang_engines(plan, args.base_port, args.dp_per_server, hosts, args.node,
                                                args.engine_host, api_key, args.deterministic)
        _warn(deploy.exposure_warning({e.host for e in engines}, bool(api_key), key_env))
    else:
        engines = deploy.local_engines(plan, args.engine_command)
        config = deploy.gateway_config(plan, engines)
    if args.dry_run:
        print(deploy.render(engines, config, key_env))
        return 0
    deploy.setup_logging()
    config_out = Path(args.config_out) if args.config_out else Path(args.plan).with_suffix(".cascade.toml")

    def say(message: str) -> None:
        print(message, flush=True)

    return deploy.run(engines, config, config_out, Path(args.log_dir), args.startup_timeout_s, args.max_restarts, say,
                      args.plan, private=bool(api_key))


def _scale_out(args: argparse.Namespace) -> int:
    """`cascade deploy --gateways N`: Envoy, the gateway commands and the Kubernetes manifests."""
    from cascade.errors import ConfigError
    from cascade.optimizer import envoy, kube

    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--listen {args.listen!r}: give HOST:PORT, e.g. 127.0.0.1:8000")
    out = Path(args.out) if args.out else Path(args.plan).with_suffix(".scaleout")
    config = args.config_out or str(Path(args.plan).with_suffix(".cascade.toml"))
    upstreams = envoy.gateways(args.gateways, "127.0.0.1", args.gateway_port)
    files = {"envoy.json": envoy.to_json(envoy.bootstrap(upstreams, host.strip("[]"), int(port), args.admin_port)),
             "gateways.sh": envoy.gateway_commands(upstreams, config, args.plan, str(out / "envoy.json"))}
    scaled = kube.Gateways(replicas=args.gateways, image=args.image, in_flight_per_pod=args.hpa_in_flight,
                           max_replicas=args.max_gateways or 4 * args.gateways)
    files |= {f"k8s/{stem}.json": envoy.to_json(doc) for stem, doc in kube.manifests(scaled).items()}
    for name, text in files.items():
        if args.dry_run:
            print(f"# --- {out / name}\n{text}")
            continue
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    if not args.dry_run:
        (out / "gateways.sh").chmod(0o755)
        print(f"wrote {', '.join(str(out / n) for n in files)}. Start the engines (`cascade deploy` without "
              f"--gateways), then {out / 'gateways.sh'}; clients connect to {args.listen}. Kubernetes: "
              f"kubectl create configmap cascade-config --from-file=cascade.toml={config} "
              f"--from-file=plan.json={args.plan}; kubectl apply -f {out / 'k8s'}")
    return 0


def _warn(message: str | None) -> None:
    if message:
        print(message, file=sys.stderr, flush=True)
