"""`cascade deploy`: launch and supervise a plan's engines and write the gateway config that points at them
(cascade/deploy/launch.py), or with --gateways, Envoy in front of N gateways and Kubernetes manifests
(cascade/deploy/envoy.py, cascade/deploy/kube.py). Also `cascade extproc --print-envoy`: the Envoy bootstrap in front
of the model picker (`add_picker_envoy_options`). Only argparse here at import time: `cascade --help` stays light."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_deploy_command(sub: argparse._SubParsersAction) -> None:
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
                       "`cascade serve` commands and Envoy), OUT/k8s/*.json (N replicas) and OUT/monitoring/ (a "
                       "Grafana dashboard and Prometheus alerting rules)")
    scale.add_argument("--out", metavar="DIR", help="with --gateways: where to write (default: PLAN.scaleout/)")
    scale.add_argument("--gateway-port", type=int, default=8001, help="first gateway port; the N gateways listen on "
                       "127.0.0.1, ports %(default)s, %(default)s+1, ...")
    scale.add_argument("--monitoring-port", type=int, metavar="PORT", help="first monitoring port: gateway i serves "
                       "/metrics and /ready's detail on PORT+i, not on its clients' port (default: on it)")
    scale.add_argument("--listen", default="127.0.0.1:8000", metavar="HOST:PORT",
                       help="where Envoy takes the clients (default: %(default)s; 0.0.0.0:8000 for every interface)")
    scale.add_argument("--admin-port", type=int, default=9901, help="Envoy's admin port (bound to 127.0.0.1)")
    scale.add_argument("--image", default="cascade:latest", help="the Deployment's container image")
    scale.add_argument("--max-gateways", type=int, help="the autoscaler's maximum (default: 4 x N)")
    scale.add_argument("--hpa-in-flight", type=int, default=8,
                       help="the autoscaler's target of cascade_in_flight_requests per gateway")
    deploy.set_defaults(func=_deploy)


def add_picker_envoy_options(extproc: argparse.ArgumentParser) -> None:
    """`cascade extproc --print-envoy` and its options (`extproc`: the command's parser, cascade/extproc/cli.py): print
    the picker topology's Envoy bootstrap (cascade/deploy/envoy.py) instead of serving. Deploy writes every Envoy
    document; the command serves as extproc's own without --print-envoy."""
    envoy = extproc.add_argument_group("Envoy bootstrap (--print-envoy)")
    envoy.add_argument("--print-envoy", action="store_true",
                       help="print the Envoy bootstrap (JSON; `envoy -c FILE`) for these tiers and exit")
    envoy.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                       help="Envoy's client address (default 127.0.0.1:8080; 0.0.0.0:8080 for every interface)")
    envoy.add_argument("--admin-port", type=int, default=9901, help="Envoy's admin port, bound to 127.0.0.1 (9901)")
    envoy.add_argument("--extproc-address", metavar="HOST:PORT",
                       help="where Envoy reaches this server (default: --host:--port, loopback for 0.0.0.0)")
    envoy.add_argument("--message-timeout-ms", type=int, default=1000,
                       help="Envoy's wait for each answer of the processor before failing the request (1000)")
    extproc.set_defaults(func=_extproc_or_envoy)


def _extproc_or_envoy(args: argparse.Namespace) -> int:
    from cascade.extproc.cli import run_extproc

    return _print_picker_envoy(args) if args.print_envoy else run_extproc(args)


def _print_picker_envoy(args: argparse.Namespace) -> int:
    from cascade.deploy.envoy import picker_bootstrap, to_json
    from cascade.errors import ConfigError
    from cascade.extproc.cli import endpoint, read_options
    from cascade.extproc.engines import Endpoint, tier_engines

    config, _, gateway = read_options(args)
    if args.message_timeout_ms < 1:
        raise ConfigError("--message-timeout-ms must be at least 1")
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    extproc = endpoint(args.extproc_address, "--extproc-address") if args.extproc_address else Endpoint(host, args.port)
    document = picker_bootstrap(tier_engines(config), extproc, endpoint(args.listen, "--listen"), args.admin_port,
                                gateway=gateway, max_body_bytes=config.gateway.limits.max_body_bytes,
                                message_timeout_ms=args.message_timeout_ms, limits=config.gateway.limits)
    print(to_json(document), end="")
    return 0


def _deploy(args: argparse.Namespace) -> int:
    from cascade.deploy import launch, notes
    from cascade.engines import sglang_launch
    from cascade.errors import ConfigError
    from cascade.plan import load_plan

    plan = load_plan(args.plan)
    if idle := [d.tier for d in plan.deployment if d.gpus == 0]:
        raise ConfigError(f"{args.plan}: tier(s) {', '.join(idle)} have no GPUs (planned with [cluster] "
                          "deploy_every_tier = false, a fleet sized for the target's traffic alone): a gateway would "
                          "route other hints there; plan with deploy_every_tier = true to deploy it")
    if args.gateways is not None:
        return _scale_out(args)
    if args.engine_command and args.engine != "local":
        raise ConfigError("--engine-command applies to --engine local")
    if args.engine_host is not None and args.engine != "sglang":
        raise ConfigError("--engine-host applies to --engine sglang (local engines bind 127.0.0.1)")
    if args.deterministic and args.engine != "sglang":
        raise ConfigError("--deterministic applies to --engine sglang (its --enable-deterministic-inference)")
    key_env = args.engine_api_key_env
    api_key = launch.engine_api_key(key_env) if args.engine == "sglang" else ""
    config_out = Path(args.config_out) if args.config_out else Path(args.plan).with_suffix(".cascade.toml")
    hf_token = notes.hf_token_line(d.model for d in plan.deployment) if args.engine == "sglang" else ""
    if args.engine == "sglang" and args.dry_run:
        hosts = [h.strip() for h in args.hosts.split(",") if h.strip()] if args.hosts else None
        placement = sglang_launch.launch_plan(launch.with_card_parsers(plan), hosts=hosts, base_port=args.base_port,
                                              dp_per_server=args.dp_per_server, engine_host=args.engine_host,
                                              api_key=f"${{{key_env}}}" if api_key else "",  # never the value
                                              deterministic=args.deterministic)
        _warn(launch.exposure_warning({s.listen for s in placement.servers}, bool(api_key), key_env))
        print(sglang_launch.render(placement, key_env if api_key else ""))
        print("\n".join([hf_token, *notes.written_files(config_out, Path(args.log_dir))]))
        return 0
    if args.node and args.engine != "sglang":
        raise ConfigError("--node applies to --engine sglang")
    if args.engine == "sglang":
        hosts = [h.strip() for h in args.hosts.split(",") if h.strip()] if args.hosts else None
        engines, config = launch.sglang_engines(plan, args.base_port, args.dp_per_server, hosts, args.node,
                                                args.engine_host, api_key, args.deterministic)
        _warn(launch.exposure_warning({e.host for e in engines}, bool(api_key), key_env))
    else:
        engines = launch.local_engines(plan, args.engine_command)
        config = launch.gateway_config(plan, engines)
    if args.dry_run:
        print(launch.render(engines, config, key_env))
        print("\n".join([*([hf_token] if hf_token else []),
                         *notes.written_files(config_out, Path(args.log_dir), [e.name for e in engines])]))
        return 0
    launch.setup_logging()
    if hf_token:
        print(hf_token.removeprefix("# "), flush=True)

    def say(message: str) -> None:
        print(message, flush=True)

    return launch.run(engines, config, config_out, Path(args.log_dir), args.startup_timeout_s, args.max_restarts, say,
                      args.plan, private=bool(api_key))


def _scale_out(args: argparse.Namespace) -> int:
    """`cascade deploy --gateways N`: Envoy, the gateway commands and the Kubernetes manifests."""
    from cascade.deploy import envoy, kube
    from cascade.deploy.monitoring import files as monitoring_files
    from cascade.errors import ConfigError
    from cascade.extproc.engines import Endpoint

    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--listen {args.listen!r}: give HOST:PORT, e.g. 127.0.0.1:8000")
    out = Path(args.out) if args.out else Path(args.plan).with_suffix(".scaleout")
    config = args.config_out or str(Path(args.plan).with_suffix(".cascade.toml"))
    upstreams = envoy.gateways(args.gateways, "127.0.0.1", args.gateway_port)
    monitoring = args.monitoring_port or 0
    if not 0 <= monitoring <= 65536 - args.gateways:
        raise ConfigError(f"--monitoring-port {monitoring}: expected 1 to {65536 - args.gateways} for "
                          f"{args.gateways} gateways (0: off)")
    clash = {monitoring + i for i in range(args.gateways)} & {g.port for g in upstreams} if monitoring else set()
    if clash:
        raise ConfigError(f"--monitoring-port {monitoring}: port {min(clash)} is also a gateway's (--gateway-port "
                          f"{args.gateway_port})")
    bootstrap = envoy.gateways_bootstrap(upstreams, Endpoint(host.strip("[]"), int(port)), args.admin_port)
    files = {"envoy.json": envoy.to_json(bootstrap),
             "gateways.sh": envoy.gateway_commands(upstreams, config, args.plan, str(out / "envoy.json"),
                                                    monitoring)}
    scaled = kube.Gateways(replicas=args.gateways, image=args.image, in_flight_per_pod=args.hpa_in_flight,
                           max_replicas=args.max_gateways or 4 * args.gateways)
    files |= {f"k8s/{stem}.json": envoy.to_json(doc) for stem, doc in kube.manifests(scaled).items()}
    files |= {f"monitoring/{name}": text for name, text in monitoring_files().items()}  # Grafana, Prometheus rules
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
