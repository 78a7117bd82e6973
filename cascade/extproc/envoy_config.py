"""The Envoy bootstrap for cascade as the model picker (`cascade extproc --print-envoy`, docs/scaling.md).

    listener      HTTP/1.1 and HTTP/2; its buffer limit is `[gateway.limits] max_body_bytes` (the body is buffered
                  whole for the processor: a larger one is Envoy's 413)
    filters       ext_proc (request headers SEND, request body BUFFERED, nothing of the response, so streams pass
                  through untouched; fail closed: no decision, no request), then the router
    routes        POST /v1/chat/completions with `x-cascade-via: gateway` -> the gateway (with --gateway);
                  with `x-cascade-tier: T` -> tier T's cluster (the engines' path prefix added, `x-cascade-tier`
                  added to the response); with neither (only before the processor has answered) -> a 500 OpenAI error;
                  any other path -> the gateway, or a 404 OpenAI error (the processor is off there)
    clusters      the processor (gRPC: HTTP/2), one per tier (its backends' hosts), the gateway (with --gateway)

As in `cascade deploy --gateways` (cascade/optimizer/envoy.py): no timeout cuts a long reasoning stream (route
timeout and stream idle timeout off), and retries only before the first byte reached an engine.
"""

from __future__ import annotations

import ipaddress

from cascade.extproc.engines import Endpoint, TierEngine
from cascade.extproc.picker import CHAT_PATH, HINT_HEADER, TIER_HEADER, VIA_HEADER
from cascade.optimizer.envoy import RETRY_ON
from cascade.service.errors import error_response

EXTPROC_CLUSTER = "cascade_extproc"
GATEWAY_CLUSTER = "cascade_gateway"
_EXT_PROC = "envoy.filters.http.ext_proc"
_TYPES = "type.googleapis.com/envoy.extensions"
_HCM = f"{_TYPES}.filters.network.http_connection_manager.v3.HttpConnectionManager"
_PREVIOUS_HOSTS = f"{_TYPES}.retry.host.previous_hosts.v3.PreviousHostsPredicate"
_OVERWRITE = "OVERWRITE_IF_EXISTS_OR_ADD"
# The request headers the picker reads (cascade/extproc/picker.py), the only ones Envoy sends it.
FORWARDED = (":path", ":method", "content-length", "authorization", HINT_HEADER)


def bootstrap(engines: list[TierEngine], extproc: Endpoint, listen: Endpoint, admin_port: int, *,
              gateway: Endpoint | None = None, max_body_bytes: int = 1_048_576,
              message_timeout_ms: int = 1000) -> dict[str, object]:
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
    manager = {
        "@type": _HCM,
        "stat_prefix": "cascade_extproc",
        "codec_type": "AUTO",
        "stream_idle_timeout": "0s",  # off: a slow first token (long thinking) is not an idle stream
        "request_timeout": "0s",
        "route_config": {"name": "cascade", "virtual_hosts": [
            {"name": "cascade", "domains": ["*"], "routes": _routes(engines, gateway is not None)}]},
        "http_filters": [
            {"name": _EXT_PROC, "typed_config": ext_proc},
            {"name": "envoy.filters.http.router",
             "typed_config": {"@type": f"{_TYPES}.filters.http.router.v3.Router"}},
        ],
    }
    http2 = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": f"{_TYPES}.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}}}}  # gRPC
    clusters = [{**_cluster(EXTPROC_CLUSTER, [extproc]), "typed_extension_protocol_options": http2},
                *(_engine_cluster(e) for e in engines)]
    if gateway is not None:
        clusters.append(_cluster(GATEWAY_CLUSTER, [gateway]))
    return {
        "admin": {"address": _address(Endpoint("127.0.0.1", admin_port))},
        "static_resources": {
            "listeners": [{
                "name": "cascade_extproc", "address": _address(listen),
                "per_connection_buffer_limit_bytes": max_body_bytes,
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                "typed_config": manager}]}],
            }],
            "clusters": clusters,
        },
    }


def _routes(engines: list[TierEngine], gateway: bool) -> list[dict[str, object]]:
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
    if gateway:
        routes.append({"match": {"prefix": "/"}, "route": _forward(GATEWAY_CLUSTER), "typed_per_filter_config": off})
    else:
        routes.append({**_direct({"prefix": "/"}, 404, f"this proxy serves POST {CHAT_PATH} only",
                                 "invalid_request_error"), "typed_per_filter_config": off})
    return routes


def _chat(header: str, value: str) -> dict[str, object]:
    return {"path": CHAT_PATH, "headers": [{"name": header, "string_match": {"exact": value}}]}


def _forward(cluster: str) -> dict[str, object]:
    return {
        "cluster": cluster,
        "timeout": "0s",  # no upstream response deadline: a reasoning stream may run for many minutes
        "retry_policy": {
            "retry_on": RETRY_ON, "num_retries": 3, "host_selection_retry_max_attempts": 3,
            "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
                                      "typed_config": {"@type": _PREVIOUS_HOSTS}}],
        },
    }


def _direct(match: dict[str, object], status: int, message: str, kind: str) -> dict[str, object]:
    body = error_response(message, kind).decode()
    return {"match": match, "direct_response": {"status": status, "body": {"inline_string": body}},
            "response_headers_to_add": [_header("content-type", "application/json")]}


def _header(key: str, value: str) -> dict[str, object]:
    return {"header": {"key": key, "value": value}, "append_action": _OVERWRITE}


def _engine_cluster(engine: TierEngine) -> dict[str, object]:
    cluster = {
        **_cluster(engine.cluster, list(engine.endpoints)),
        "outlier_detection": {
            "consecutive_5xx": 5, "interval": "5s", "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 2, "base_ejection_time": "30s", "max_ejection_percent": 50,
        },
    }
    if engine.tls:
        cluster["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": f"{_TYPES}.transport_sockets.tls.v3.UpstreamTlsContext", "sni": engine.endpoints[0].host}}
    return cluster


def _cluster(name: str, endpoints: list[Endpoint]) -> dict[str, object]:
    return {
        "name": name,
        "type": "STATIC" if _all_ips(endpoints) else "STRICT_DNS",
        "connect_timeout": "2s",
        "lb_policy": "LEAST_REQUEST",
        "load_assignment": {"cluster_name": name, "endpoints": [
            {"lb_endpoints": [{"endpoint": {"address": _address(e)}} for e in endpoints]}]},
    }


def _address(endpoint: Endpoint) -> dict[str, object]:
    return {"socket_address": {"address": endpoint.host, "port_value": endpoint.port}}


def _all_ips(endpoints: tuple[Endpoint, ...] | list[Endpoint]) -> bool:
    try:
        for e in endpoints:
            ipaddress.ip_address(e.host)
    except ValueError:
        return False
    return True
