"""What the gateway counts about a request (Prometheus metrics) and logs (the traffic log)."""

from __future__ import annotations

import logging
import time

from cascade.branches.runner import BranchReport
from cascade.errors import BackendError
from cascade.router.load import Headroom
from cascade.service.decision import Decision
from cascade.service.metrics import GatewayMetrics
from cascade.service.traffic import TrafficLog, TrafficRecord
from cascade.tiers.answer import Answer
from cascade.tiers.build import Tier

log = logging.getLogger("cascade.gateway")

_BRANCH_EVENTS = ("launched", "finished", "pruned_phase1", "pruned_phase2", "pruned_confidence", "early_stopped",
                 "failed")


class Telemetry:
    def __init__(self, metrics: GatewayMetrics, traffic: TrafficLog | None = None,
                 headroom: Headroom | None = None, log_requests: bool = False) -> None:
        self.metrics = metrics
        self.traffic = traffic
        self.headroom = headroom  # load-reactive routing reads each tier's recent latencies from it
        self.log_requests = log_requests  # `[gateway] log_requests`: a line per answered request

    def success(self, decision: Decision, latency_s: float, prompt_tokens: int, completion_tokens: int,
                answer: Answer | None = None, stream: bool = False) -> None:
        tier = decision.tier
        self.metrics.requests.labels(tier.name, "ok").inc()
        self.metrics.latency.labels(tier.name).observe(latency_s)
        if self.headroom is not None:
            self.headroom.observe_e2el(tier.index, latency_s)
        self.metrics.output_tokens.labels(tier.name).inc(completion_tokens)
        if self.log_requests:
            log.info("%s", request_line(decision, latency_s, prompt_tokens, completion_tokens, answer, stream))
        if self.traffic is None:
            return
        assessment = decision.assessment
        self.traffic.write(TrafficRecord(
            ts=round(time.time(), 3), hint=decision.hint, router=decision.router, tier=tier.index,
            tier_name=tier.name, latency_s=round(latency_s, 4), prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens, stream=stream,
            difficulty=None if assessment is None else round(assessment.difficulty, 4),
            route_score=None if assessment is None else round(assessment.score, 4),
            p_fail=None if assessment is None or assessment.p_fail is None
            else [round(p, 4) for p in assessment.p_fail],
            out_of_domain=assessment is not None and assessment.out_of_domain,
            escalations=decision.escalations, branches=answer.branches_configured if answer else 1,
            decode_tokens=answer.decode_tokens if answer is not None and answer.reports else None,
        ))

    def backend_error(self, tier: Tier, exc: BackendError) -> None:
        self.metrics.requests.labels(tier.name, "backend_error").inc()
        self.metrics.backend_errors.labels(tier.name, type(exc).__name__).inc()

    def branches(self, tier: Tier, reports: list[BranchReport]) -> None:
        for report in reports:
            for event in _BRANCH_EVENTS:
                if count := getattr(report, event):
                    self.metrics.branches.labels(tier.name, event).inc(count)
            self.metrics.decode_tokens.labels(tier.name).inc(report.decode_tokens)

    def first_token(self, tier: Tier, seconds: float) -> None:
        self.metrics.ttft.labels(tier.name).observe(seconds)
        if self.headroom is not None:
            self.headroom.observe_ttft(tier.index, seconds)

    def per_token(self, tier: Tier, first_token_s: float, end_s: float, tokens: float) -> None:
        """TPOT: (end - first token) / (tokens - 1), for a streamed choice of `tokens` tokens (vLLM's definition)."""
        if tokens > 1 and end_s >= first_token_s:
            self.metrics.tpot.labels(tier.name).observe((end_s - first_token_s) / (tokens - 1))

    def degraded(self, decision: Decision) -> None:
        if decision.degraded is not None:
            d = decision.degraded
            self.metrics.degraded.labels(d.requested, d.served, "no" if d.branches is None else "yes").inc()

    def moved(self, from_tier: Tier, to_tier: Tier, why: str) -> None:
        if why == "escalated":
            self.metrics.escalations.labels(from_tier.name).inc()
        else:
            self.metrics.fallbacks.labels(from_tier.name, to_tier.name).inc()


def request_line(decision: Decision, latency_s: float, prompt_tokens: int, completion_tokens: int,
                 answer: Answer | None, stream: bool) -> str:
    """The log line of an answered request (`[gateway] log_requests`): what it asked, what answered, what it took."""
    branches = ""
    if answer is not None and answer.reports:
        launched = sum(r.launched for r in answer.reports)  # an adaptive vote often settles on its first wave
        branches = f", {launched} of {answer.branches_configured} branches, {answer.decode_tokens} decoded"
    moved = f", {decision.escalations} escalations" if decision.escalations else ""
    return (f"{'stream' if stream else 'whole'} {decision.hint} -> {decision.tier.name}: {prompt_tokens} prompt + "
            f"{completion_tokens} completion tokens in {latency_s:.1f} s{branches}{moved}")
