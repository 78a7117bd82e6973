"""`cascade extproc`: serve Envoy's ext_proc API as the inference gateway's model picker. Its `--print-envoy` (print
the Envoy bootstrap that uses it) is deploy's: cascade/deploy/cli.py adds those options to this command and prints the
document (deploy/ writes every Envoy document; extproc/ never imports deploy/). Only argparse here at import time:
`cascade --help` stays instant."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cascade.errors import ConfigError

if TYPE_CHECKING:
    from cascade.config import CascadeConfig
    from cascade.extproc.engines import Endpoint
    from cascade.plan import Plan


def add_extproc_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The command and its serving options; returned for cascade/deploy/cli.py's `--print-envoy` options."""
    p = sub.add_parser(
        "extproc", help="serve Envoy's ext_proc API: pick each chat request's tier, for Envoy to route (route mode)",
        description="Stage 1 of an inference gateway: Envoy sends each POST /v1/chat/completions (headers and whole "
        "body) to this gRPC server, which decides the tier as `cascade serve` would (quality hint, router, request "
        "checks, API keys) and answers with the header `x-cascade-tier` and the body rewritten for that tier's "
        "engine (its model name, the tier's system prompt and default max_tokens); Envoy then routes on the header "
        "to the tier's cluster (in Kubernetes, an InferencePool per tier). A bad request gets the gateway's OpenAI "
        "error at once. Route mode only: escalation and reasoning branches stay in `cascade serve`, which can sit "
        "behind Envoy as one more cluster (--gateway). Prometheus metrics and a health check: plain HTTP on "
        "--metrics-port. With --print-envoy, print the Envoy bootstrap instead (docs/scaling.md).",
    )
    p.add_argument("--config", required=True, help="cascade.toml: the tiers (their backends are the engines Envoy "
                   "routes to), [routing] and [gateway] limits and keys, as `cascade serve` reads them")
    p.add_argument("--plan", help="plan.json from `cascade optimize plan` (route mode): operating points per hint")
    p.add_argument("--host", default="127.0.0.1", help="bind address of the gRPC server (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9002, help="port of the gRPC server (default 9002)")
    p.add_argument("--metrics-port", type=int, default=9003,
                   help="plain HTTP port on --host for Prometheus (`/metrics`: cascade_extproc_* decisions per tier, "
                   "refusals per status, decision latency, requests sent to the gateway, open gRPC streams, decisions "
                   "per API key; cascade_key_rate_limited and, with [gateway.redis] url, cascade_redis_*) and "
                   "`/health` (200, for Kubernetes probes); 0 = off (default 9003)")
    p.add_argument("--gateway", metavar="HOST:PORT",
                   help="a `cascade serve` behind Envoy: requests for reasoning branches go to it (pinned to the "
                   "picked tier), and so does every path but chat completions")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run_extproc)
    return p


def read_options(args: argparse.Namespace) -> tuple[CascadeConfig, Plan | None, Endpoint | None]:
    """The config, the plan and the gateway behind Envoy, checked as both uses of the command need them (serving,
    and `--print-envoy`)."""
    from cascade.config import load_config
    from cascade.plan import load_plan

    config = load_config(args.config)
    plan = load_plan(args.plan) if args.plan else None
    gateway = endpoint(args.gateway, "--gateway") if args.gateway else None
    if not 0 <= args.metrics_port <= 65535:
        raise ConfigError(f"--metrics-port {args.metrics_port}: expected 0 (off) to 65535")
    return config, plan, gateway


def run_extproc(args: argparse.Namespace) -> int:
    """Serve the picker over gRPC until SIGTERM or Ctrl-C."""
    config, plan, gateway = read_options(args)
    if args.metrics_port == args.port:
        raise ConfigError(f"--metrics-port {args.metrics_port} is the gRPC --port: give it another (or 0, off)")
    import asyncio
    import logging

    try:
        from cascade.extproc.picker import TierPicker
        from cascade.extproc.processor import serve
    except ImportError as exc:
        raise ConfigError(f"cascade extproc needs the `extproc` extra ({exc.name} is missing): "
                          "pip install -e '.[extproc]'") from None

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    picker = TierPicker(config, plan, gateway=gateway is not None)
    asyncio.run(serve(picker, args.host, args.port, metrics_port=args.metrics_port))
    return 0


def endpoint(text: str, flag: str) -> Endpoint:
    """`host:port` (`[v6]:port`) as an Endpoint; ConfigError naming `flag` otherwise."""
    from cascade.extproc.engines import Endpoint

    host, _, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{flag} {text!r}: expected HOST:PORT")
    return Endpoint(host, int(port))
