"""Prometheus series of the gateway, in a registry of their own (one per app, so tests can run
several apps in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Seconds; spans CPU-engine answers (tens of seconds) down to fake-backend round trips.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
_DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "cascade_requests", "Chat completion requests by served tier and outcome", ["tier", "outcome"], registry=r
        )
        self.latency = Histogram(
            "cascade_request_latency_seconds", "End-to-end latency by tier", ["tier"], buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "cascade_ttft_seconds", "Time to first token by tier (streaming)", ["tier"], buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("cascade_in_flight_requests", "Requests being served now", registry=r)
        self.backend_errors = Counter(
            "cascade_backend_errors", "Upstream faults by tier and kind", ["tier", "kind"], registry=r
        )
        self.client_errors = Counter("cascade_client_errors", "Rejected requests by status", ["status"], registry=r)
        self.escalations = Counter("cascade_escalations", "Cascade escalations from a tier", ["tier"], registry=r)
        self.branches = Counter(
            "cascade_branches", "Reasoning branches by tier and event", ["tier", "event"], registry=r
        )
        self.output_tokens = Counter("cascade_output_tokens", "Completion tokens by tier", ["tier"], registry=r)
        self.decision_latency = Histogram(
            "cascade_router_decision_seconds", "Routing decision latency (featurize + classify + policy)",
            buckets=_DECISION_BUCKETS, registry=r,
        )
        self.disconnects = Counter(
            "cascade_client_disconnects", "Requests abandoned by the client and cancelled upstream", ["tier"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
