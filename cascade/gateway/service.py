"""The chat service: one pass per request, from the OpenAI request to the answer, with no web framework here.

    prepare   validate the request, decide its way along the ladder (router), check every tier it may reach
    admit     take one of the gateway's request places (chat_asgi releases it)
    complete  the itinerary serves the request over a `TierLadder`: answer on a tier (cascade/answer.py)
              inside that tier's admission; then the completion (responses.py)
    stream    the same, with the first tier's upstreams opened before any header (streaming.py)

Routing (where a request goes and when it moves on) is the router's (cascade/router/escalation.py); the
answer on one tier is cascade/answer.py's, shared with `cascade label` and `cascade bench`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import msgspec

from cascade.answer import Answer, Sampling, answer, choice_requests, question_of
from cascade.branches.backend import GenerationRequest
from cascade.branches.confidence import LOGPROBS_REQUEST
from cascade.branches.runner import BranchReport, BranchSettings
from cascade.config import AnswerConfidenceConfig, FailoverConfig, Limits, LoadReactiveConfig
from cascade.errors import BackendError, InvalidRequest, UnknownModel
from cascade.gateway import responses, streaming
from cascade.gateway.admission import Admission
from cascade.gateway.decision import Decision
from cascade.gateway.engine_load import TierEngines
from cascade.gateway.metrics import GatewayMetrics
from cascade.gateway.telemetry import Telemetry
from cascade.gateway.traffic import TrafficLog
from cascade.gateway.validation import branches_for, check_tier, forwarded, one_answer_field, stops, validate
from cascade.router.acceptance import calibrated
from cascade.router.escalation import Evidence, Itinerary, Move, Pinned, RouteMode, ServingMode
from cascade.router.load import Headroom, LoadReactive, capacities
from cascade.router.policy import NAMED_HINTS, RoutingPolicy, parse_hint
from cascade.schemas import PASSTHROUGH, ChatCompletion, ChatCompletionRequest, ModelCard, ModelList, RouteDecision
from cascade.tiers import Tier

_T = TypeVar("_T")
ROUTED_MODEL = "cascade"


class ChatService:
    def __init__(
        self,
        tiers: Sequence[Tier],
        policy: RoutingPolicy,
        limits: Limits,
        metrics: GatewayMetrics,
        default_quality: str = "balanced",
        keepalive_s: float = 2.0,
        traffic: TrafficLog | None = None,
        failover: FailoverConfig | None = None,
        mode: ServingMode | None = None,
        load: LoadReactiveConfig | None = None,
        confidence: AnswerConfidenceConfig | None = None,
        engines: TierEngines | None = None,
    ) -> None:
        self.tiers = list(tiers)
        self.by_name = {t.name: t for t in self.tiers}
        self.policy = policy
        self.mode = mode or RouteMode(len(self.tiers), (failover or FailoverConfig()).tier_fallback)
        self.limits = limits
        self.metrics = metrics
        default = parse_hint(default_quality, "gateway.default_quality")
        assert default is not None
        self.default_hint = default
        self.keepalive_s = keepalive_s
        # The engines' own load (SGLang's /metrics), where read: routing and admission count every client's requests.
        self.engines = engines
        self.admission = Admission(self.tiers, limits, metrics, engines)
        self.load = self._load_reactive(load) if load is not None and load.enabled else None
        self.telemetry = Telemetry(metrics, traffic, None if self.load is None else self.load.headroom)
        self.confidence = confidence or AnswerConfidenceConfig()

    def _load_reactive(self, config: LoadReactiveConfig) -> LoadReactive:
        tiers = [(t.name, t.config.branch_slots, t.config.branches) for t in self.tiers]
        headroom = Headroom([t.name for t in self.tiers], config, capacities(config, tiers),
                            lambda tier: self.admission.tier_load[tier],
                            engine=None if self.engines is None else self.engines.view,
                            streams=[t.config.branches for t in self.tiers])
        self.metrics.watch_headroom(headroom)
        return LoadReactive(config, headroom)

    # --- before anything is sent ----------------------------------------------------------------

    def model_list(self) -> ModelList:
        ids = [ROUTED_MODEL, *(f"{ROUTED_MODEL}:{h}" for h in NAMED_HINTS), *self.by_name]
        return ModelList(data=[ModelCard(id=i) for i in ids])

    def prepare(self, req: ChatCompletionRequest, header_hint: str | None) -> tuple[Decision, int]:
        """Validate, decide, and check every tier the request may reach: a bad request fails here, before
        any header. Returns the decision and the max_tokens to use (0: each tier's default)."""
        max_tokens = validate(req, self.limits)
        decision = self.decide(req, header_hint)
        reachable = [self.tiers[i] for i in decision.itinerary.reachable()]
        used = forwarded(req)
        decision.branches = {tier.index: check_tier(req, tier, self.limits, used) for tier in reachable}
        if self.load is not None and req.branches is None:
            self._shed_branches(decision)
        self.telemetry.degraded(decision)
        one_answer = one_answer_field(req)
        if one_answer is not None and any(t.config.branches > 1 for t in reachable):
            decision.note = f"one branch: `{one_answer}` asks for the engine's answer as it is, not a vote"
        return decision, max_tokens

    def decide(self, req: ChatCompletionRequest, header_hint: str | None) -> Decision:
        model = req.model
        # Hints are checked even when a tier name makes them moot: a bad value is the client's mistake.
        body_hint, header = parse_hint(req.quality, "quality"), parse_hint(header_hint, "X-Cascade-Quality")
        if model in self.by_name:
            tier = self.by_name[model]
            return Decision(itinerary=Pinned(tier.index), tier=tier, hint="bypass")
        base, _, alias = model.partition(":")
        if base != ROUTED_MODEL:
            raise UnknownModel(model, [m.id for m in self.model_list().data])
        hint = body_hint or header or parse_hint(alias or None, "model") or self.default_hint
        start = time.perf_counter()
        route = self.policy.route(question_of(req.messages), hint)
        itinerary: Itinerary = self.mode.itinerary(route, hint)
        degraded = None
        if self.load is not None:
            itinerary, degraded = self.load.adjust(
                hint, itinerary, lambda other: self.mode.itinerary(self.policy.reroute(route, other), other))
        self.metrics.decision_latency.observe(time.perf_counter() - start)
        if route.assessment.out_of_domain:
            self.metrics.out_of_domain.inc()
        return Decision(itinerary=itinerary, tier=self.tiers[itinerary.first], hint=hint.label, quality=hint,
                        degraded=degraded)

    def _shed_branches(self, decision: Decision) -> None:
        """Load-reactive: a movable request runs only the branches that must finish on a pressed tier."""
        assert self.load is not None
        if decision.quality is None:
            return
        for index, settings in decision.branches.items():
            if settings is None or (cut := self.load.branches(decision.quality, index, settings.n, settings.m)) is None:
                continue
            decision.branches[index] = msgspec.structs.replace(settings, n=settings.m)
            earlier = decision.degraded
            decision.degraded = cut if earlier is None else msgspec.structs.replace(earlier, branches=cut.branches)

    def route_decision(self, decision: Decision) -> RouteDecision:
        return responses.route_decision(decision, self.tiers)

    def admit(self) -> None:
        self.admission.admit()

    def release(self) -> None:
        self.admission.release()

    # --- answering --------------------------------------------------------------------------------

    async def complete(self, req: ChatCompletionRequest, decision: Decision, max_tokens: int) -> ChatCompletion:
        start = time.perf_counter()
        decision, whole = await self._serve(req, decision, max_tokens)
        usage = responses.usage_of(whole)
        self.telemetry.success(decision, time.perf_counter() - start, usage.prompt_tokens, usage.completion_tokens,
                               whole)
        return responses.completion(decision, whole)

    async def open_stream(
        self, req: ChatCompletionRequest, decision: Decision, max_tokens: int
    ) -> tuple[Decision, AsyncGenerator[bytes, None]]:
        """Start the upstream streams and wait for their first delta, so that a backend fault becomes
        an HTTP error status (or a fallback to another tier) instead of a broken 200 stream. Returns the
        decision that will answer and the SSE frame iterator. The caller must start the iterator
        (`anext`) before anything else can fail, and `aclose` it: that is what closes the upstreams."""
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if decision.itinerary.judges_answers or self._branches(req, decision, decision.tier) is not None:
            return decision, streaming.deferred(lambda: self._serve(req, decision, max_tokens), self.keepalive_s,
                                                include_usage, self.telemetry)
        served = await decision.itinerary.serve(self._ladder(req, lambda tier: self._open(req, tier, max_tokens)))
        decision = decision.served(served, self.tiers)
        opened = served.answer
        return decision, streaming.relay(opened, decision, include_usage, self.telemetry,
                                         lambda: self.admission.leave(opened.tier, len(opened.streams)))

    async def _serve(self, req: ChatCompletionRequest, decision: Decision, max_tokens: int) -> tuple[Decision, Answer]:
        served = await decision.itinerary.serve(
            self._ladder(req, lambda tier: self._answer(req, tier, max_tokens, self._branches(req, decision, tier),
                                                        decision.itinerary.judges_answers)))
        return decision.served(served, self.tiers), served.answer

    def _ladder(self, req: ChatCompletionRequest, answer_on: Callable[[Tier], Awaitable[_T]]) -> TierLadder[_T]:
        return TierLadder(self.tiers, answer_on, lambda tier: self._fits(req, tier), self.telemetry)

    def _fits(self, req: ChatCompletionRequest, tier: Tier) -> bool:
        """Whether `tier` can serve the request as asked (a fallback tier is checked only when needed)."""
        try:
            check_tier(req, tier, self.limits)
        except InvalidRequest:
            return False
        return True

    def _branches(self, req: ChatCompletionRequest, decision: Decision, tier: Tier) -> BranchSettings | None:
        """The request's branch settings on `tier`: checked in `prepare` for every reachable tier, so only a
        route-mode fallback tier (checked by `_fits`) computes them here."""
        if tier.index in decision.branches:
            return decision.branches[tier.index]
        return branches_for(req, tier, self.limits)

    async def _answer(self, req: ChatCompletionRequest, tier: Tier, max_tokens: int,
                      settings: BranchSettings | None, judges: bool = False) -> Answer:
        """All `n` choices of one tier, inside the tier's admission (backend errors are counted)."""
        streams = req.n * (settings.n if settings is not None else 1)
        sampling = sampling_of(req, max_tokens)
        # Token logprobs the client did not ask for: read here (acceptance, pruning), never passed on.
        ours = self._reads_logprobs(req, judges, tier, settings)
        if ours:
            sampling = msgspec.structs.replace(sampling, extra={**sampling.extra, **LOGPROBS_REQUEST})
        self.admission.enter(tier, streams)
        try:
            whole = await answer(tier, req.messages, sampling, settings, req.n, tier.slots,
                                 self.limits.max_slot_wait_s)
        except BackendError as exc:
            self.telemetry.backend_error(tier, exc)
            raise
        finally:
            self.admission.leave(tier, streams)
        self.telemetry.branches(tier, whole.reports)
        if judges and self.confidence.source != "prior":
            calibration = self.confidence.calibration.get(tier.name)
            whole.confidence = [None if c is None else calibrated(c.read(self.confidence.source), calibration)
                                for c in whole.token_confidence(self.confidence.group_tokens)]
        if ours:
            for result in whole.results:
                result.logprobs = None
        return whole

    def _reads_logprobs(self, req: ChatCompletionRequest, judges: bool, tier: Tier,
                        settings: BranchSettings | None) -> bool:
        """Whether to ask `tier`'s engine for token logprobs the client did not ask for: cascade mode reads the
        answer's token confidence below the top tier (which always accepts), or the tier prunes branches on it;
        only where the engine returns them (they cost llama.cpp's server 8x its decode time)."""
        if req.logprobs or not tier.returns_logprobs:
            return False
        pruning = settings is not None and settings.prune_confidence > 0
        return pruning or (judges and self.confidence.source != "prior" and tier.index < len(self.tiers) - 1)

    async def _open(self, req: ChatCompletionRequest, tier: Tier, max_tokens: int) -> streaming.Opened:
        """One tier's upstream streams, one per choice, with their first deltas read (its admission is
        left when the relay closes them)."""
        self.admission.enter(tier, req.n)
        try:
            streams = [tier.backend.stream(r) for r in requests_of(req, tier, max_tokens)]
            return await streaming.open_streams(tier, streams)
        except BaseException as exc:
            if isinstance(exc, BackendError):
                self.telemetry.backend_error(tier, exc)
            self.admission.leave(tier, req.n)
            raise


class TierLadder(Generic[_T]):
    """The gateway's side of the router's `Ladder`: answers on a tier with `answer_on`, tells which tiers can
    take the request, reads an Answer's evidence, and counts every move."""

    def __init__(self, tiers: list[Tier], answer_on: Callable[[Tier], Awaitable[_T]], fits: Callable[[Tier], bool],
                 telemetry: Telemetry) -> None:
        self.tiers = tiers
        self.answer_on = answer_on
        self.fits = fits
        self.telemetry = telemetry

    async def answer(self, tier: int) -> _T:
        return await self.answer_on(self.tiers[tier])

    def evidence(self, answer: _T) -> list[Evidence]:
        assert isinstance(answer, Answer)
        agreements = [_agreement(r) for r in answer.reports] or [None] * len(answer.results)
        confidence = answer.confidence or [None] * len(answer.results)
        return [Evidence(finish_reason=r.finish_reason, text=r.text, tool_calls=bool(r.tool_calls), agreement=a,
                         token_confidence=c)
                for r, a, c in zip(answer.results, agreements, confidence, strict=True)]

    def can_take(self, tier: int) -> bool:
        candidate = self.tiers[tier]
        return candidate.backend.available() and self.fits(candidate)

    def moved(self, from_tier: int, to_tier: int, why: Move) -> None:
        self.telemetry.moved(self.tiers[from_tier], self.tiers[to_tier], why)


def sampling_of(req: ChatCompletionRequest, max_tokens: int) -> Sampling:
    extra = {name: value for name in PASSTHROUGH if (value := getattr(req, name)) is not None}
    return Sampling(max_tokens=max_tokens or None, temperature=req.temperature, top_p=req.top_p, stop=stops(req),
                    seed=req.seed, extra=extra)


def requests_of(req: ChatCompletionRequest, tier: Tier, max_tokens: int) -> list[GenerationRequest]:
    """What a streamed single-branch answer sends upstream, one request per choice (as `answer` would)."""
    return choice_requests(tier, req.messages, sampling_of(req, max_tokens), req.n)


def _agreement(report: BranchReport) -> float | None:
    """Share of the finished branches that gave the voted answer (None with fewer than two)."""
    if report.finished < 2 or report.answer is None:
        return None
    return report.votes.get(report.answer, 0) / report.finished

