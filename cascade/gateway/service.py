"""The chat service: validate, route, call the tier's backend, and shape OpenAI responses.

Plain Python over msgspec Structs: no web framework here, so it is tested without HTTP and the
routes stay thin. Streaming output is produced as ready-to-send SSE frames (bytes).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

import msgspec

from cascade.branches.backend import GenerationRequest, GenerationResult, StreamDelta
from cascade.branches.runner import BranchReport, BranchRunner, BranchSettings
from cascade.config import Failover, Limits
from cascade.errors import BackendError, CascadeError, InvalidRequest, Overloaded, UnknownModel
from cascade.gateway.frames import DONE, ChunkFrames
from cascade.gateway.frames import sse as _sse
from cascade.gateway.metrics import GatewayMetrics
from cascade.gateway.traffic import TrafficLog, TrafficRecord
from cascade.router.acceptance import accepts, answer_confidence, first_tier, next_tier
from cascade.router.policy import NAMED_HINTS, Assessment, QualityHint, RoutingPolicy, parse_hint
from cascade.schemas import (
    ONE_ANSWER,
    PASSTHROUGH,
    AssistantMessage,
    BranchStats,
    CascadeInfo,
    ChatCompletion,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    ChoiceLogprobs,
    FunctionCallDelta,
    ModelCard,
    ModelList,
    RouteDecision,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from cascade.tiers import Tier, branch_requests, branch_settings, tier_request

_T = TypeVar("_T")
ROUTED_MODEL = "cascade"
# SSE comment sent while a cascade (or branches) works before the first token: proxies and clients
# with idle timeouts keep the connection, and OpenAI SDKs ignore comments.
KEEPALIVE = b": keep-alive\n\n"
_encode = msgspec.json.Encoder().encode


class Decision(msgspec.Struct, kw_only=True):
    tier: Tier
    hint: str
    router: str  # the routing signal's name, or "bypass" when the client named a tier
    assessment: Assessment | None = None
    thresholds: list[float] | None = None
    quality: QualityHint | None = None  # None when the client named a tier
    # Cascade mode: acceptance thresholds, escalations so far, and the accepted answer's confidence.
    accept: list[float] | None = None
    escalations: int = 0
    confidence: float | None = None
    fallback_from: str | None = None  # route mode: the tier that failed before this one answered
    note: str | None = None  # shown as cascade.note


class Answer(msgspec.Struct, kw_only=True):
    """A tier's answer: one result per choice and, for branched tiers, what the branches did."""

    results: list[GenerationResult]
    reports: list[BranchReport] = msgspec.field(default_factory=list)
    branches_configured: int = 1


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
        failover: Failover | None = None,
    ) -> None:
        self.tiers = list(tiers)
        self.by_name = {t.name: t for t in self.tiers}
        self.policy = policy
        self.limits = limits
        self.metrics = metrics
        default = parse_hint(default_quality, "gateway.default_quality")
        assert default is not None
        self.default_hint = default
        self.in_flight = 0
        self.keepalive_s = keepalive_s
        self.traffic = traffic
        self.failover = failover or Failover()
        # Per-tier admission and the upstream stream budget (see `_enter`).
        self.tier_caps = [t.config.max_in_flight or limits.max_in_flight_per_tier for t in self.tiers]
        self.tier_load = [0] * len(self.tiers)
        self._tier_gauges = [metrics.tier_in_flight.labels(t.name) for t in self.tiers]  # no lookup per request
        self.streams_open = 0

    # --- models and validation -------------------------------------------------------------

    def model_list(self) -> ModelList:
        ids = [ROUTED_MODEL, *(f"{ROUTED_MODEL}:{h}" for h in NAMED_HINTS), *self.by_name]
        return ModelList(data=[ModelCard(id=i) for i in ids])

    def validate(self, req: ChatCompletionRequest) -> int:
        """Check limits the types cannot express; return the max_tokens to use."""
        lim = self.limits
        if not req.messages:
            raise InvalidRequest("`messages` must contain at least one message", "messages", "empty_messages")
        if len(req.messages) > lim.max_messages:
            raise InvalidRequest(f"`messages` has {len(req.messages)} entries; the limit is {lim.max_messages}",
                                 "messages")
        if not 1 <= req.n <= lim.max_n:
            raise InvalidRequest(f"`n` must be between 1 and {lim.max_n}, got {req.n}", "n")
        if req.temperature is not None and not (0.0 <= req.temperature <= 2.0 and math.isfinite(req.temperature)):
            raise InvalidRequest(f"`temperature` must be in [0, 2], got {req.temperature}", "temperature")
        if req.top_p is not None and not (0.0 < req.top_p <= 1.0):
            raise InvalidRequest(f"`top_p` must be in (0, 1], got {req.top_p}", "top_p")
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        if len(stops) > lim.max_stop_sequences:
            raise InvalidRequest(f"`stop` may have at most {lim.max_stop_sequences} sequences", "stop")
        if req.stream_options is not None and not req.stream:
            raise InvalidRequest("`stream_options` is only allowed when `stream` is true", "stream_options")
        for name in ("max_completion_tokens", "max_tokens"):
            value = getattr(req, name)
            if value is not None and not 1 <= value <= lim.max_tokens:
                raise InvalidRequest(f"`{name}` must be between 1 and {lim.max_tokens}, got {value}", name)
        return req.max_completion_tokens or req.max_tokens or 0

    def decide(self, req: ChatCompletionRequest, header_hint: str | None) -> Decision:
        model = req.model
        # Hints are checked even when a tier name makes them moot: a bad value is the client's mistake.
        body_hint, header = parse_hint(req.quality, "quality"), parse_hint(header_hint, "X-Cascade-Quality")
        if model in self.by_name:
            return Decision(tier=self.by_name[model], hint="bypass", router="bypass")
        base, _, alias = model.partition(":")
        if base != ROUTED_MODEL:
            raise UnknownModel(model, [m.id for m in self.model_list().data])
        hint = body_hint or header or parse_hint(alias or None, "model") or self.default_hint
        start = time.perf_counter()
        route = self.policy.route(_last_user_text(req.messages), hint)
        index, accept = route.tier, None
        if self.policy.mode == "cascade":
            accept = self.policy.accept(hint)
            index = first_tier(accept)
        self.metrics.decision_latency.observe(time.perf_counter() - start)
        if route.assessment.out_of_domain:
            self.metrics.out_of_domain.inc()
        return Decision(tier=self.tiers[index], hint=hint.label, router=route.router, assessment=route.assessment,
                        thresholds=accept or route.thresholds, quality=hint, accept=accept)

    def preflight(self, req: ChatCompletionRequest, decision: Decision) -> None:
        """Check what depends on the tiers before anything is sent: the branch settings (with the request's
        overrides) of every tier the request may reach, so that a bad override is a 400, not an error
        event inside a 200 stream."""
        reachable = self.tiers[decision.tier.index:] if decision.accept is not None else [decision.tier]
        used = _forwarded(req)
        for tier in reachable:
            if refused := sorted(used & tier.unsupported):
                raise InvalidRequest(f"tier `{tier.name}`'s engine does not support `{refused[0]}` (it would ignore "
                                     "it): name a tier whose engine does, or leave the field out", refused[0])
            self.branch_settings(req, tier)
        one_answer = _one_answer_field(req)
        if one_answer is not None and any(t.config.branches > 1 for t in reachable):
            decision.note = f"one branch: `{one_answer}` asks for the engine's answer as it is, not a vote"

    def route_decision(self, decision: Decision) -> RouteDecision:
        assessment = decision.assessment
        p_fail = None
        if assessment is not None and assessment.p_fail is not None:
            p_fail = {t.name: round(p, 4) for t, p in zip(self.tiers, assessment.p_fail, strict=True)}
        return RouteDecision(
            tier=decision.tier.index, tier_name=decision.tier.name, quality=decision.hint, router=decision.router,
            difficulty=None if assessment is None else round(assessment.difficulty, 4),
            route_score=None if assessment is None else round(assessment.score, 4),
            p_fail=p_fail,
            thresholds=None if decision.thresholds is None
            else [t if math.isfinite(t) else None for t in decision.thresholds],
            out_of_domain=assessment is not None and assessment.out_of_domain,
        )

    # --- generation --------------------------------------------------------------------------

    def admit(self) -> None:
        if self.in_flight >= self.limits.max_in_flight:
            raise Overloaded(f"the gateway is at its limit of {self.limits.max_in_flight} requests in flight")
        self.in_flight += 1
        self.metrics.in_flight.inc()

    def release(self) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.dec()

    def _enter(self, tier: Tier, streams: int) -> None:
        """Occupy one of the tier's request places and `streams` upstream streams, or raise Overloaded
        (a 429): a stalled tier fills only its own places, so the other tiers keep answering."""
        cap = self.tier_caps[tier.index]
        if self.tier_load[tier.index] >= cap:
            raise Overloaded(f"tier `{tier.name}` is at its limit of {cap} requests in flight")
        if self.streams_open + streams > self.limits.max_backend_streams:
            raise Overloaded(f"the gateway is at its limit of {self.limits.max_backend_streams} backend streams "
                             f"({self.streams_open} open; this request needs {streams})")
        self.tier_load[tier.index] += 1
        self.streams_open += streams
        self._tier_gauges[tier.index].inc()

    def _leave(self, tier: Tier, streams: int) -> None:
        self.tier_load[tier.index] -= 1
        self.streams_open -= streams
        self._tier_gauges[tier.index].dec()

    def _fallback(self, decision: Decision, req: ChatCompletionRequest) -> Tier | None:
        """Route mode: the nearest other tier that can take a request now (higher first at equal
        distance, so quality is kept where it can be), or None when the client named the tier."""
        if decision.router == "bypass" or decision.accept is not None or not self.failover.tier_fallback:
            return None
        here, used = decision.tier.index, _forwarded(req)
        for distance in range(1, len(self.tiers)):
            for index in (here + distance, here - distance):
                if 0 <= index < len(self.tiers) and self.tiers[index].backend.available() \
                        and not used & self.tiers[index].unsupported:
                    return self.tiers[index]
        return None

    async def _with_fallback(self, req: ChatCompletionRequest, decision: Decision,
                             work: Callable[[Decision], Awaitable[_T]]) -> tuple[Decision, _T]:
        """`work` on the decision's tier; if that tier fails, once more on the fallback tier (route mode)."""
        try:
            return decision, await work(decision)
        except BackendError:
            fallback = self._fallback(decision, req)
            if fallback is None:
                raise
        self.metrics.fallbacks.labels(decision.tier.name, fallback.name).inc()
        decision = msgspec.structs.replace(decision, tier=fallback, fallback_from=decision.tier.name)
        return decision, await work(decision)

    def _generation(self, req: ChatCompletionRequest, tier: Tier, max_tokens: int, index: int) -> GenerationRequest:
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        # Distinct seeds per choice so that n > 1 gives distinct samples, yet stays reproducible.
        seed = None if req.seed is None else req.seed + index
        request = tier_request(tier, req.messages, max_tokens, req.temperature, req.top_p, stops, seed)
        extra = {name: value for name in PASSTHROUGH if (value := getattr(req, name)) is not None}
        return msgspec.structs.replace(request, extra=extra) if extra else request

    def _info(self, decision: Decision, answer: Answer | None = None) -> CascadeInfo:
        assessment = decision.assessment
        branches = BranchStats(configured=answer.branches_configured if answer else decision.tier.config.branches,
                               launched=0 if answer is None else len(answer.results),
                               finished=0 if answer is None else len(answer.results))
        if answer is not None and answer.reports:
            reports = answer.reports
            branches = BranchStats(
                configured=answer.branches_configured, launched=sum(r.launched for r in reports),
                finished=sum(r.finished for r in reports),
                pruned=sum(r.pruned_phase1 + r.pruned_phase2 for r in reports),
                early_stopped=sum(r.early_stopped for r in reports),
                pruned_phase1=sum(r.pruned_phase1 for r in reports),
                pruned_phase2=sum(r.pruned_phase2 for r in reports),
                failed=sum(r.failed for r in reports), decode_tokens=sum(r.decode_tokens for r in reports),
                votes=reports[0].votes if len(reports) == 1 else None,
            )
        return CascadeInfo(
            tier=decision.tier.index, tier_name=decision.tier.name, quality=decision.hint,
            difficulty=None if assessment is None else round(assessment.difficulty, 4),
            route_score=None if assessment is None else round(assessment.score, 4), router=decision.router,
            out_of_domain=assessment is not None and assessment.out_of_domain, escalations=decision.escalations,
            confidence=None if decision.confidence is None else round(decision.confidence, 4),
            branches=branches, retries=0 if answer is None else sum(r.retries for r in answer.results),
            fallback_from=decision.fallback_from, note=decision.note,
        )

    async def complete(self, req: ChatCompletionRequest, decision: Decision, max_tokens: int) -> ChatCompletion:
        start = time.perf_counter()
        decision, answer = await self._serve(req, decision, max_tokens)
        return self._completion(decision, answer, start)

    async def _serve(self, req: ChatCompletionRequest, decision: Decision, max_tokens: int) -> tuple[Decision, Answer]:
        if decision.accept is not None:
            return await self._cascade(req, decision, max_tokens)
        return await self._with_fallback(req, decision, lambda d: self._answer(req, d.tier, max_tokens))

    def branch_settings(self, req: ChatCompletionRequest, tier: Tier) -> BranchSettings | None:
        """The tier's SART settings with the request's overrides (validated), or None for one branch."""
        override = req.branches
        one_answer = _one_answer_field(req)
        if one_answer is not None:
            if override is not None and (override.n or 1) > 1:
                raise InvalidRequest(f"`branches.n` > 1 cannot be combined with `{one_answer}`: branches vote on "
                                     "answer text, and that field asks for the engine's one answer as it is",
                                     "branches.n")
            return None  # one branch, the engine's answer as it gave it (cascade.note says so)
        settings = branch_settings(tier)
        n, m = settings.n, settings.m
        if override is not None:
            n = override.n if override.n is not None else n
            m = override.m if override.m is not None else min(m, n)
            settings = msgspec.structs.replace(
                settings, n=n, m=m,
                alpha=settings.alpha if override.alpha is None else override.alpha,
                beta=settings.beta if override.beta is None else override.beta,
                score_every_steps=settings.score_every_steps if override.k is None else override.k,
                aggregation=override.aggregation or settings.aggregation,
            )
            _check_branch_override(settings, self.limits.max_branches)
        streams, limit = settings.n * req.n, self.limits.max_streams_per_request
        if streams > limit:
            raise InvalidRequest(f"{settings.n} branches x n={req.n} would open {streams} backend streams on tier "
                                 f"`{tier.name}`; the limit per request is {limit}",
                                 "branches.n" if override is not None else "n")
        if tier.slots is not None and settings.n * req.n > tier.slots.capacity:
            raise InvalidRequest(f"{settings.n} branches x n={req.n} exceed tier `{tier.name}`'s "
                                 f"{tier.slots.capacity} branch slots", "branches.n")
        return settings if settings.n > 1 else None

    async def _answer(self, req: ChatCompletionRequest, tier: Tier, max_tokens: int) -> Answer:
        """All `n` choices of one tier, collected (backend errors are counted)."""
        settings = self.branch_settings(req, tier)
        streams = req.n * (settings.n if settings is not None else 1)
        self._enter(tier, streams)
        try:
            if settings is not None:
                return await self._branched(req, tier, max_tokens, settings)
            # The pool streams upstream even for a non-streaming client (the read timeout then bounds the
            # silence between tokens, not the whole answer) and retries a failed answer on another replica.
            return Answer(results=await _all_or_none(
                tier.backend.generate(self._generation(req, tier, max_tokens, i)) for i in range(req.n)))
        except BackendError as exc:
            self._count_backend_error(tier, exc)
            raise
        finally:
            self._leave(tier, streams)

    async def _branched(self, req: ChatCompletionRequest, tier: Tier, max_tokens: int,
                        settings: BranchSettings) -> Answer:
        """SART on one tier: per choice, `settings.n` branches through the runner (cascade/branches)."""
        runner = BranchRunner(tier.backend, settings, tier.scorer)
        question = _last_user_text(req.messages)
        # Branches need distinct samples: distinct seeds (reproducible when the request has a seed) and
        # a sampling temperature unless the request set one.
        base_seed = req.seed if req.seed is not None else secrets.randbelow(1 << 31)
        temperature = req.temperature if req.temperature is not None else tier.config.branch_temperature
        needed = settings.n * req.n
        released = 0

        def branch_ended() -> None:
            nonlocal released
            released += 1
            if tier.slots is not None:
                tier.slots.release(1)

        if tier.slots is not None:
            await tier.slots.acquire(needed, self.limits.max_slot_wait_s)
        try:
            runs = await _all_or_none(
                runner.run(question, branch_requests(self._generation(req, tier, max_tokens, 0),
                                                     base_seed + c * settings.n, settings.n, temperature), branch_ended)
                for c in range(req.n)
            )
        finally:
            if tier.slots is not None and released < needed:  # e.g. cancelled before every branch started
                tier.slots.release(needed - released)
        reports = [r.report for r in runs]
        for report in reports:
            for event, count in (("launched", report.launched), ("finished", report.finished),
                                 ("pruned_phase1", report.pruned_phase1), ("pruned_phase2", report.pruned_phase2),
                                 ("early_stopped", report.early_stopped), ("failed", report.failed)):
                if count:
                    self.metrics.branches.labels(tier.name, event).inc(count)
            self.metrics.decode_tokens.labels(tier.name).inc(report.decode_tokens)
        results = [GenerationResult(text=r.text, reasoning=r.reasoning, finish_reason=r.finish_reason,
                                    prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens) for r in runs]
        return Answer(results=results, reports=reports, branches_configured=settings.n)

    async def _cascade(
        self, req: ChatCompletionRequest, decision: Decision, max_tokens: int
    ) -> tuple[Decision, Answer]:
        """Cascade mode: answer on the decision's tier, escalate while the answer's confidence is below
        the tier's acceptance threshold or the tier fails (cascade/router/acceptance.py)."""
        accept = decision.accept
        assert accept is not None
        assessment = decision.assessment
        # An out-of-domain prompt's p_fail is the router's extrapolation: no prior, as without a learned router.
        p_fail = assessment.p_fail if assessment is not None and not assessment.out_of_domain else None
        index = decision.tier.index
        while True:
            tier = self.tiers[index]
            decision = msgspec.structs.replace(decision, tier=tier)
            try:
                answer = await self._answer(req, tier, max_tokens)
            except BackendError:
                if index == len(self.tiers) - 1:
                    raise
                confidence = 0.0
            else:
                prior = None if p_fail is None else 1.0 - p_fail[index]
                agreements = [_agreement(r) for r in answer.reports] or [None] * len(answer.results)
                confidence = min(answer_confidence(prior, r.finish_reason, r.text, agreement, bool(r.tool_calls))
                                 for r, agreement in zip(answer.results, agreements, strict=True))
                if accepts(index, confidence, accept):
                    return msgspec.structs.replace(decision, confidence=confidence), answer
            self.metrics.escalations.labels(tier.name).inc()
            decision = msgspec.structs.replace(decision, escalations=decision.escalations + 1)
            index = next_tier(index, accept)

    def _completion(self, decision: Decision, answer: Answer, start: float) -> ChatCompletion:
        tier, results = decision.tier, answer.results
        usage = Usage(
            prompt_tokens=results[0].prompt_tokens,
            completion_tokens=sum(r.completion_tokens for r in results),
        )
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
        self._count_success(decision, time.perf_counter() - start, usage.prompt_tokens, usage.completion_tokens, answer)
        return ChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=tier.name,
            choices=[
                Choice(index=i, finish_reason=r.finish_reason,
                       message=AssistantMessage(content=None if r.tool_calls and not r.text else r.text,
                                                reasoning_content=r.reasoning or None, tool_calls=r.tool_calls),
                       logprobs=None if r.logprobs is None else ChoiceLogprobs(content=r.logprobs))
                for i, r in enumerate(results)
            ],
            usage=usage, cascade=self._info(decision, answer),
        )

    async def _deferred_frames(
        self, req: ChatCompletionRequest, decision: Decision, max_tokens: int
    ) -> AsyncGenerator[bytes, None]:
        """A stream whose answer is known only at the end (cascade mode, reasoning branches): SSE comments
        keep the connection alive meanwhile, then the answer is sent, so TTFT honestly includes the wait."""
        start = time.perf_counter()
        work = asyncio.ensure_future(self._serve(req, decision, max_tokens))
        try:
            while True:
                done, _ = await asyncio.wait({work}, timeout=self.keepalive_s)
                if done:
                    break
                yield KEEPALIVE
            decision, answer = work.result()
        except CascadeError as exc:
            # Headers are gone: a backend fault, or no branch slots in time (Overloaded), ends the
            # stream with an in-band error rather than a dropped connection.
            if isinstance(exc, Overloaded):
                self.metrics.client_errors.labels("429").inc()
            yield _in_band_error(exc)
            return
        finally:
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
        tier, results = decision.tier, answer.results
        frames = ChunkFrames(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), tier.name)
        body = [frames.role(len(results), self._info(decision, answer))]
        for i, r in enumerate(results):
            if r.tool_calls or r.logprobs:
                body.append(frames.delta(i, r.text, r.reasoning, _call_pieces(r.tool_calls), r.logprobs))
            else:
                body.append(frames.content(i, r.text, r.reasoning))
            body.append(frames.finish(i, r.finish_reason))
        self.metrics.ttft.labels(tier.name).observe(time.perf_counter() - start)
        completion_tokens = sum(r.completion_tokens for r in results)
        usage = None
        if req.stream_options and req.stream_options.include_usage:
            usage = Usage(prompt_tokens=results[0].prompt_tokens, completion_tokens=completion_tokens,
                          total_tokens=results[0].prompt_tokens + completion_tokens)
        body.append(frames.tail(self._info(decision, answer), usage))
        yield b"".join(body)
        self._count_success(decision, time.perf_counter() - start, results[0].prompt_tokens, completion_tokens, answer,
                            stream=True)

    async def open_stream(
        self, req: ChatCompletionRequest, decision: Decision, max_tokens: int
    ) -> tuple[Decision, AsyncGenerator[bytes, None]]:
        """Start the upstream streams and wait for their first delta, so that a backend fault becomes
        an HTTP error status (or a fallback to another tier) instead of a broken 200 stream. Returns the
        decision that will answer and the SSE frame iterator. The caller must start the iterator
        (`anext`) before anything else can fail, and `aclose` it: that is what closes the upstreams."""
        if decision.accept is not None or self.branch_settings(req, decision.tier) is not None:
            return decision, self._deferred_frames(req, decision, max_tokens)
        return await self._with_fallback(req, decision, lambda d: self._open_direct(req, d, max_tokens))

    async def _open_direct(self, req: ChatCompletionRequest, decision: Decision, max_tokens: int
                           ) -> AsyncGenerator[bytes, None]:
        tier = decision.tier
        self._enter(tier, req.n)
        start = time.perf_counter()
        streams = [tier.backend.stream(self._generation(req, tier, max_tokens, i)) for i in range(req.n)]
        firsts: list[StreamDelta | None] = []
        try:
            for stream in streams:
                firsts.append(await anext(stream, None))
        except BaseException as exc:
            if isinstance(exc, BackendError):
                self._count_backend_error(tier, exc)
            await _close_all(streams)
            self._leave(tier, req.n)
            raise
        return self._frames(req, decision, streams, firsts, start)

    async def _frames(
        self, req: ChatCompletionRequest, decision: Decision, streams: list[AsyncGenerator[StreamDelta, None]],
        firsts: list[StreamDelta | None], start: float,
    ) -> AsyncGenerator[bytes, None]:
        tier = decision.tier
        frames = ChunkFrames(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), tier.name)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        prompt_tokens = 0
        completion_tokens = [0] * len(streams)
        finished = 0
        first_token = True
        retries = sum(f.retries for f in firsts if f is not None)

        def frame_for(index: int, delta: StreamDelta) -> bytes:
            nonlocal prompt_tokens, finished, first_token
            if delta.prompt_tokens is not None:
                prompt_tokens = delta.prompt_tokens
            if delta.completion_tokens is not None:
                completion_tokens[index] = delta.completion_tokens
            frame = b""
            if delta.text or delta.reasoning or delta.tool_calls or delta.logprobs:
                if first_token:
                    self.metrics.ttft.labels(tier.name).observe(time.perf_counter() - start)
                    first_token = False
                if delta.completion_tokens is None:
                    completion_tokens[index] += delta.chunks
                if delta.tool_calls or delta.logprobs:  # rare: the fast path below carries text only
                    frame = frames.delta(index, delta.text, delta.reasoning, delta.tool_calls, delta.logprobs)
                else:
                    frame = frames.content(index, delta.text, delta.reasoning)
            if delta.finish_reason is not None:
                finished += 1
                frame += frames.finish(index, delta.finish_reason)
            return frame

        # n = 1 (the common case) reads its stream directly: no interleaving generator in between,
        # one async-generator hop fewer per token.
        merged = _merge(streams, firsts) if len(streams) > 1 else None
        try:
            yield frames.role(len(streams), self._info(decision))
            if merged is None:
                if firsts[0] is not None:
                    if frame := frame_for(0, firsts[0]):
                        yield frame
                    async for delta in streams[0]:
                        # One send per upstream read, whatever it held.
                        if frame := frame_for(0, delta):
                            yield frame
            else:
                async for index, delta in merged:
                    if frame := frame_for(index, delta):
                        yield frame
        except BackendError as exc:
            # Headers are gone already: report the fault in-band, as OpenAI does, then end the stream.
            self._count_backend_error(tier, exc)
            yield _in_band_error(exc)
            return
        finally:
            try:
                if merged is not None:
                    await merged.aclose()
                await _close_all(streams)
            finally:
                self._leave(tier, len(streams))
        total_completion = sum(completion_tokens)
        usage = None
        if include_usage:
            usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=total_completion,
                          total_tokens=prompt_tokens + total_completion)
        done = [GenerationResult(text="", retries=retries) for _ in range(finished)]
        yield frames.tail(self._info(decision, Answer(results=done)), usage)
        self._count_success(decision, time.perf_counter() - start, prompt_tokens, total_completion, stream=True)

    def _count_success(self, decision: Decision, latency_s: float, prompt_tokens: int, completion_tokens: int,
                       answer: Answer | None = None, stream: bool = False) -> None:
        tier = decision.tier
        self.metrics.requests.labels(tier.name, "ok").inc()
        self.metrics.latency.labels(tier.name).observe(latency_s)
        self.metrics.output_tokens.labels(tier.name).inc(completion_tokens)
        if self.traffic is not None:
            assessment = decision.assessment
            reports = answer.reports if answer is not None else []
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
                decode_tokens=sum(r.decode_tokens for r in reports) if reports else None,
            ))

    def _count_backend_error(self, tier: Tier, exc: BackendError) -> None:
        self.metrics.requests.labels(tier.name, "backend_error").inc()
        self.metrics.backend_errors.labels(tier.name, type(exc).__name__).inc()


def _forwarded(req: ChatCompletionRequest) -> set[str]:
    """The PASSTHROUGH fields the request sets to something an engine could act on (`logprobs: false`
    asks for nothing)."""
    return {name for name in PASSTHROUGH if getattr(req, name) not in (None, False)}


def _one_answer_field(req: ChatCompletionRequest) -> str | None:
    """The first field the request sets that asks for the engine's one answer (tools, logprobs, a format)."""
    return next((name for name in ONE_ANSWER if getattr(req, name) not in (None, False)), None)


def _call_pieces(calls: list[ToolCall] | None) -> list[ToolCallDelta] | None:
    """Whole tool calls as the stream pieces that carry them (one piece per call)."""
    if not calls:
        return None
    return [ToolCallDelta(index=i, id=c.id, type=c.type, function=FunctionCallDelta(name=c.function.name,
                                                                                   arguments=c.function.arguments))
            for i, c in enumerate(calls)]


def _agreement(report: BranchReport) -> float | None:
    """Share of the finished branches that gave the voted answer (None with fewer than two)."""
    if report.finished < 2 or report.answer is None:
        return None
    return report.votes.get(report.answer, 0) / report.finished


def _check_branch_override(settings: BranchSettings, max_branches: int) -> None:
    checks = [
        (1 <= settings.n <= max_branches, "branches.n", f"must be between 1 and {max_branches}"),
        (1 <= settings.m <= settings.n, "branches.m", f"must be between 1 and branches.n ({settings.n})"),
        (0.0 <= settings.alpha <= 1.0, "branches.alpha", "must be in [0, 1]"),
        (0 <= settings.beta <= settings.n, "branches.beta", f"must be between 0 and branches.n ({settings.n})"),
        (1 <= settings.score_every_steps <= 1000, "branches.k", "must be between 1 and 1000"),
    ]
    for ok, param, rule in checks:
        if not ok:
            raise InvalidRequest(f"`{param}` {rule}", param)


def _in_band_error(exc: CascadeError) -> bytes:
    """A fault after the headers went out is reported in-band, as OpenAI does, and ends the stream."""
    kind = "rate_limit_error" if isinstance(exc, Overloaded) else "server_error"
    error = {"error": {"message": exc.message, "type": kind, "param": None, "code": None}}
    return _sse(_encode(error)) + DONE


def _last_user_text(messages: list[ChatMessage]) -> str:
    for message in reversed(messages):
        if message.role == "user":
            return message.text()
    return messages[-1].text()


async def _all_or_none(work: Iterable[Awaitable[_T]]) -> list[_T]:
    """Await all; on the first failure (or cancellation) cancel the rest and wait for them, so no
    upstream request outlives the one it was made for (asyncio.gather leaves them running)."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _close_all(streams: list[AsyncGenerator[StreamDelta, None]]) -> None:
    for stream in streams:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


async def _merge(
    streams: list[AsyncGenerator[StreamDelta, None]], firsts: list[StreamDelta | None]
) -> AsyncGenerator[tuple[int, StreamDelta], None]:
    """Interleave several delta streams as (choice index, delta), in arrival order."""
    for index, first in enumerate(firsts):
        if first is not None:
            yield index, first
    queue: asyncio.Queue[tuple[int, StreamDelta | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[StreamDelta, None]) -> None:
        try:
            async for delta in stream:
                await queue.put((index, delta))
            await queue.put((index, None))
        except Exception as exc:  # handed to the consumer, which re-raises it
            await queue.put((index, exc))

    pumps = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams) if firsts[i] is not None]
    try:
        remaining = len(pumps)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
