"""`[gateway]` of `cascade.toml`: where the gateway listens, who may call it, and the limits that protect the process
(`[gateway.limits]`), where they are counted (`[gateway.redis]`), how it fails over (`[gateway.failover]`), how it
watches its engines' health (`[gateway.health]`), where its traces go (`[gateway.tracing]`) and what the Responses
API keeps (`[gateway.responses]`).

Limits (body size, `n`, `max_tokens`, ...) live here with their defaults so that each has one number and one place.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from cascade.config.base import Port, PositiveFloat, PositiveInt, Strict, UnitFloat


class Limits(Strict, frozen=True):
    """Hard limits on what one request may ask for; beyond them the request gets a 400/413."""

    max_body_bytes: PositiveInt = 1_048_576
    max_messages: PositiveInt = 512
    max_n: PositiveInt = 8
    max_tokens: PositiveInt = 32_768
    max_stop_sequences: PositiveInt = 4
    # What a request may send on to an engine (docs/operations.md, "What reaches an engine"): OpenAI's own bounds
    # where it states one (top_logprobs 20, logit_bias 300 entries, 128 tools, metadata 16 pairs of 64/512
    # characters), so that no client makes an engine compute 10^9 candidates per token, build a 40k-entry bias row
    # or render 8,000 tools into every prompt. Beyond one: a 400 naming the field, before any tier is asked.
    # 128 at most: SGLang's disaggregated serving holds that many per token (disaggregation/utils.py).
    max_top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=128)] = 20
    max_logit_bias: PositiveInt = 300
    max_tools: PositiveInt = 128
    max_tools_bytes: PositiveInt = 262_144  # the `tools` array as JSON (every schema rendered into the prompt)
    max_metadata_pairs: PositiveInt = 16
    max_metadata_key_chars: PositiveInt = 64
    max_metadata_value_chars: PositiveInt = 512
    max_user_chars: PositiveInt = 256
    max_template_kwargs: PositiveInt = 32  # keys of `chat_template_kwargs` (enable_thinking, thinking, ...)
    # Entries of `stop_token_ids` (SGLang's and vLLM's extra): engines check each generated token against them all.
    max_stop_token_ids: PositiveInt = 64
    # How deep a body's arrays and objects may nest (a tool's JSON schema is the deepest part of a real one; OpenAI
    # allows 10 levels of schema). Deeper bodies get a 400 before decoding (cascade/service/bodies.py); the cap keeps
    # msgspec's recursion (about Python's recursion limit, 1,000) out of reach.
    max_json_depth: Annotated[int, msgspec.Meta(ge=8, le=512)] = 64
    # Admission: requests in flight beyond this get 429 instead of queueing without bound.
    max_in_flight: PositiveInt = 1024
    # ... and per tier (a tier's own `max_in_flight` overrides it): one stalled tier fills only its own
    # share, so the other tiers keep answering. Keep it below max_in_flight.
    max_in_flight_per_tier: PositiveInt = 512
    # Upstream streams: one request opens n x branches of them (400 beyond the first limit), and all
    # requests together at most the second (429 beyond it).
    max_streams_per_request: PositiveInt = 32
    max_backend_streams: PositiveInt = 2048
    # Reasoning branches a request may ask for (`branches.n`), and how long it may wait for a tier's
    # branch slots before a 429.
    max_branches: PositiveInt = 16
    max_slot_wait_s: PositiveFloat = 60.0
    # Connections (cascade/gateway/connections.py). A request's line and headers at most; beyond, 431.
    max_header_bytes: PositiveInt = 65_536
    # Open client connections per gateway process (lowered to half the open-file limit if that is less).
    # When full, the connection that has waited longest without a request in flight is closed to admit
    # the new one; when every one has a request in flight, the new one gets 503.
    max_connections: PositiveInt = 4096
    # A request's line and headers must arrive within this of its first byte (of the accept, for a
    # connection's first request), its body within body_timeout_s of its headers; else 408 and close.
    header_timeout_s: PositiveFloat = 10.0
    body_timeout_s: PositiveFloat = 30.0
    # Idle time allowed between requests on a connection; above the 5 s after which httpx (the OpenAI
    # SDK) stops reusing one, so that a client never sends on a connection the gateway is closing.
    keepalive_timeout_s: PositiveFloat = 15.0
    # A client that stops reading its response: once the socket's send buffer has stayed full this long, the
    # connection is dropped, which frees its request place and closes its upstream streams.
    write_timeout_s: PositiveFloat = 60.0


class FailoverConfig(Strict, frozen=True):
    """Replica failover and circuit breaking (cascade/branches/pool.py), and tier fallback."""

    # Further attempts, each on another replica of the tier, after a fault before any byte reached the
    # client (0: none).
    retries: Annotated[int, msgspec.Meta(ge=0, le=8)] = 1
    # Consecutive faults that bench a replica (one refused connection always does).
    breaker_failures: PositiveInt = 3
    # First bench; it doubles after each failed half-open probe, up to breaker_max_open_s.
    breaker_open_s: PositiveFloat = 1.0
    breaker_max_open_s: PositiveFloat = 30.0
    # Route mode: when the chosen tier fails (every replica tried) before any byte reached the client,
    # answer on the nearest tier that can take the request (the response says so), unless the request
    # named the tier.
    tier_fallback: bool = True


class HealthConfig(Strict, frozen=True):
    """Engine health, probed in the background (cascade/branches/health_poller.py): one probe loop per engine URL,
    however many tiers and replicas share it, with the replica's own health check (GET /health; SGLang's runs a
    one-token generation). `/ready` and routing read the last verdicts and never wait for an engine."""

    # False: no probes; every replica counts as healthy and only its circuit breaker decides.
    enabled: bool = True
    # From the start of one probe of an engine to the start of the next (a slower probe delays the next one: never
    # two at once on one engine). Each gateway probes each engine this often: an SGLang probe is a generation.
    interval_s: Annotated[float, msgspec.Meta(ge=0.05, le=300)] = 2.0
    # One probe at most, on top of the backend's own limit (an SGLang backend's `timeouts.health_s`, 30 s; other
    # backends' `connect_s`, 5 s): an engine that has not answered by then failed the probe. The default leaves
    # SGLang's 1-20 s health check its own timeout.
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=600)] = 30.0
    # Consecutive failed probes that mark an engine down (its replicas get no requests; a tier with none left
    # fails at once with 503, or falls back in route mode), and consecutive passes that mark it up again.
    unhealthy_after: Annotated[int, msgspec.Meta(ge=1, le=100)] = 2
    healthy_after: Annotated[int, msgspec.Meta(ge=1, le=100)] = 1


class ApiKey(Strict, frozen=True):
    """One `[[gateway.keys]]` entry: a client (tenant) by the sha256 of its key (`cascade keys add` makes both), its
    rate limits and what it may ask for. `name` labels its metrics; the key itself is never stored."""

    name: str
    sha256: str  # hex digest of the whole key as sent after `Bearer `
    # Per minute, as token buckets refilled continuously (a full minute's worth may arrive at once); 0: unlimited.
    requests_per_minute: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Tokens billed: reserved before dispatch (the prompt's bound, its UTF-8 bytes and a template's own tokens, +
    # max_tokens x n x the most branches a tier it may reach runs), then corrected to what the engines processed and
    # decoded for it (the prompt per upstream request, every branch, pruned and stopped ones included, every escalated
    # draft, retries that produced tokens: the `billed` figure).
    tokens_per_minute: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Its requests in flight at once (per gateway process, and across gateways sharing Redis); 0: unlimited. So that
    # one key cannot hold every place of a tier.
    max_in_flight: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0
    # Quality hints it may use with `cascade` models (fast, balanced, best; "numeric" for a number); empty: all.
    hints: tuple[str, ...] = ()
    # Tiers that may serve it, whether it names one as its model or the router, an escalation or a fallback picks it;
    # empty: all.
    tiers: tuple[str, ...] = ()
    # Spend per period, in the tiers' [tiers.price] currency (0: none): each request reserves its worst case before
    # dispatch and settles to its cost; once spent and reserved reach it, 429 insufficient_quota until the period
    # resets (cascade/service/keys/budgets.py). Periods are UTC: "hour", "day", "month" (calendar), or seconds since the
    # Unix epoch in windows of that length.
    budget: Annotated[float, msgspec.Meta(ge=0, le=1e12)] = 0.0
    budget_period: Literal["hour", "day", "month"] | Annotated[int, msgspec.Meta(ge=1, le=31_622_400)] = "month"
    # Past this fraction of the budget (0: off), requests are served as `downgrade_to` asks (a quality hint, or a
    # tier) instead of as they ask, with a `cascade.note` saying so.
    downgrade_at: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.0
    downgrade_to: str = "fast"


class RedisConfig(Strict, frozen=True):
    """`[gateway.redis]`, the shared limits (docs/scaling.md, "What is global"): with a Redis `url`
    ("redis://127.0.0.1:6379/0", "rediss://" for TLS, "unix:///path"), the keys' rate limits and the admission limits
    (`max_in_flight`, each tier's places) are counted in that Redis, so that N gateways together hold them, not N
    times them. Empty: each gateway process counts its own. Separate deployments on one Redis need their own
    database number."""

    url: str = ""
    # When Redis does not answer within timeout_s: "open" admits, each gateway holding its own in-process limits as
    # without Redis (a key may then get up to N times its limits); "closed" refuses the request with a 503 (an OpenAI
    # error, Retry-After: 1). Either way the failures are logged (a line per 10 s at most) and counted in /metrics
    # (cascade_redis_*).
    failure: Literal["open", "closed"] = "open"
    # The most one Redis call may take, connecting included: each request makes up to three (its key's buckets, the
    # gateway's place, its tier's place), so this bounds what a slow or gone Redis adds to it. Loopback or one
    # data-centre hop answers in well under 1 ms.
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=5)] = 0.25


class ResponsesConfig(Strict, frozen=True):
    """`[gateway.responses]`, the conversations `POST /v1/responses` keeps (`store`, `previous_response_id`;
    cascade/service/responses_api/): in Redis when `[gateway.redis] url` is set (shared by every gateway on it), else
    in each gateway process, bounded by `max_entries` and `max_bytes` (the least recently used go first) and lost on a
    restart. Every limit is a number here (docs/operations.md, "The Responses API")."""

    # How long a stored response stays readable after it was written (30 days, as OpenAI keeps them); Redis expires
    # the key, the in-process store drops it when next touched or evicted.
    ttl_s: Annotated[int, msgspec.Meta(ge=1, le=31_622_400)] = 2_592_000
    # In-process store only: responses kept, and their records' bytes together.
    max_entries: PositiveInt = 10_000
    max_bytes: PositiveInt = 67_108_864
    # A conversation through `previous_response_id`: its stored history and the new input together as JSON (what
    # is sent to the engine as messages), and its responses in a chain. Past either: a 400 naming the parameter.
    max_conversation_bytes: PositiveInt = 1_048_576
    max_conversation_turns: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 256


class TracingConfig(Strict, frozen=True):
    """`[gateway.tracing]`, OpenTelemetry traces (docs/operations.md, "Tracing"; needs the `otel` extra): one trace per
    request, exported over OTLP/HTTP to `endpoint` ("http://127.0.0.1:4318/v1/traces"). Empty: off, and nothing of
    OpenTelemetry is imported or sent. The exporter's own environment (OTEL_EXPORTER_OTLP_TRACES_HEADERS, ...) and
    OTEL_RESOURCE_ATTRIBUTES apply."""

    endpoint: str = ""
    # The share of new traces recorded; a request whose `traceparent` says sampled or not keeps its caller's choice
    # while `follow_caller_sampling` is on (OpenTelemetry's parent-based default). Off, `sampler_ratio` decides for
    # every request and a caller's traceparent only names the trace and the parent: for clients the operator does not
    # trust, who could otherwise have all their requests traced (each costs the export's encoding CPU).
    sampler_ratio: UnitFloat = 1.0
    follow_caller_sampling: bool = True
    service_name: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] = "cascade"
    # Prompts and answers on the upstream call spans (gen_ai.input.messages / gen_ai.output.messages). Off: spans
    # carry models, token counts, tiers and timings, never text.
    capture_text: bool = False


class GatewayConfig(Strict, frozen=True):
    host: str = "127.0.0.1"
    port: Port = 8000
    # 1-65535: /metrics and /ready's detail (tiers, unhealthy replicas) on this port of `host` instead, as Envoy's admin
    # port and SGLang's model gateway (--prometheus-port) keep them off the clients' port; the main port's /metrics is
    # then a 404 and its /ready answers the status alone, same code (cascade/gateway/monitoring.py). 0: off.
    monitoring_port: Port = 0
    # /metrics on the clients' port when monitoring_port is 0. Unset: served unless the gateway has [[gateway.keys]]
    # (whose series name each key's requests, tokens and spend) and listens beyond loopback; then it is a 404 that
    # says to set monitoring_port, or this to true to serve it there anyway. true/false: always/never.
    metrics_on_client_port: bool | None = None
    # Empty: no authentication (the default binds loopback only).
    api_keys: tuple[str, ...] = ()
    # Keys as tenants, each with its own limits (ApiKey); either or both of these may be set.
    keys: tuple[ApiKey, ...] = ()
    default_quality: str = "balanced"
    # Seconds between SSE keep-alive comments while a stream waits for its first token (cascade mode).
    keepalive_s: PositiveFloat = 2.0
    # JSONL of served requests (router outputs, tier, tokens, latency; no text) for `cascade optimize`'s
    # drift check. Empty: off. Relative to the working directory.
    traffic_log: str = ""
    # One log line per answered request (hint, tier, tokens, seconds, branches) at INFO on the `cascade.gateway`
    # logger: for a newcomer watching `cascade serve`, not for a fleet at hundreds of requests a second (use the
    # traffic log and /metrics there). The embedded default turns it on.
    log_requests: bool = False
    # SIGTERM/SIGINT: stop accepting connections and let requests in flight finish for up to this long;
    # then streams end with an error event and other requests get 503 (cascade/gateway/drain.py).
    shutdown_grace_s: PositiveFloat = 30.0
    # Idle keep-alive connections (a load balancer's pool) stay open up to this long after the signal, answering
    # any request with a 503 that says "draining", until their clients close them: closing one under a load
    # balancer that is writing a request on it loses that request. Longer than the load balancer's health-check
    # interval plus its timeout (`cascade deploy --gateways`' Envoy: 2 s + 1 s, and it closes its connections as
    # soon as it sees the gateway fail). A gateway with no connection open exits without waiting. 0: close at once.
    shutdown_linger_s: Annotated[float, msgspec.Meta(ge=0, le=300)] = 5.0
    # The names an answer carries its reasoning text under, in whole answers and stream deltas, whichever the engine
    # sent: SGLang's and OpenAI-compatible servers' `reasoning_content`, and vLLM's since 2026 `reasoning`. Both by
    # default, so that a client reading either finds it; empty: answers carry no reasoning text (still billed).
    reasoning_fields: tuple[Literal["reasoning_content", "reasoning"], ...] = ("reasoning_content", "reasoning")
    limits: Limits = Limits()
    failover: FailoverConfig = FailoverConfig()
    health: HealthConfig = HealthConfig()
    redis: RedisConfig = RedisConfig()
    tracing: TracingConfig = TracingConfig()
    responses: ResponsesConfig = ResponsesConfig()


REDIS_SCHEMES = ("redis://", "rediss://", "unix://")  # what `redis.url` may start with (cascade/config/load.py)
TRACING_SCHEMES = ("http://", "https://")  # what `tracing.endpoint` may start with (OTLP/HTTP)
