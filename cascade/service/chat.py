"""The chat service: one entry per request, from the OpenAI request and its caller (the API key) to the reply with
its usage and its bill, with no web framework here. The HTTP gateway (cascade/gateway/) and the Envoy model picker
(cascade/extproc/) both call it.

    chat      validate the request; ask the router its way along the ladder (one call: cascade/router/router.py);
              check the caller's permits (the hint it asks with, the tier it names, and the tiers that may serve it:
              the itinerary is kept to them); check every tier it may reach (the frozen Decision); take the
              request's lease (cascade/service/lease.py: the key's in-flight place, token and budget reservations,
              one of the gateway's request places, then each tier's place as it is asked); serve:
              * whole: the itinerary through a `WholeAnswerer` (cascade/service/answerers.py): whole answers on a tier
                (cascade/tiers/answer.py) inside that tier's admission; then the completion (responses.py); the lease is
                given back, and the key billed, before `chat` returns
              * streamed: the same, sent as one SSE body when known (streaming.py `deferred`; the first tier's
                admission taken before any header, the wait for branch slots after), or, for a single-branch
                answer no one judges, through a `StreamAnswerer`: the first tier's upstreams opened before any header,
                then relayed (streaming.py `relay`); the lease is given back, and the key billed, when the stream
                is closed
    route     the same decision and permits, without serving (`POST /v1/route`, the picker)

Where a request goes and when it moves on is the router's; what is sent upstream is cascade/tiers/upstream.py's; the
answer on one tier is cascade/tiers/answer.py's, shared with `cascade label` and `cascade bench`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from cascade import tracing
from cascade.config import AnswerConfidenceConfig, CascadeConfig, Limits, RoutingConfig, check_policy_mode
from cascade.errors import ConfigError, Forbidden, InvalidRequest, UnknownModel
from cascade.plan import Plan
from cascade.router.effort import EffortTable, EffortUse, effort_hint, effort_use, pick_hint, read_effort
from cascade.router.escalation import within
from cascade.router.load import TierShape
from cascade.router.offload import ProcessAssessor
from cascade.router.policy import NAMED_HINTS, ROUTED_MODEL, QualityHint, RoutingSignal, out_of_domain_note, parse_hint
from cascade.router.router import Router, Routing
from cascade.schemas import (
    REASONING_FIELDS,
    BranchOverride,
    ChatCompletion,
    ChatCompletionRequest,
    ModelCard,
    ModelList,
    RouteDecision,
)
from cascade.service import responses, streaming
from cascade.service.admission import Admission, SharedPlaces
from cascade.service.answerers import ServingTiers, StreamAnswerer, WholeAnswerer
from cascade.service.bodies import decode_chat_request
from cascade.service.decision import Decision
from cascade.service.dropped import dropped, dropped_headers, greedy_note
from cascade.service.engine_load import TierEngines
from cascade.service.intake import read_body
from cascade.service.keys.budgets import BudgetLedger, Budgets, LocalLedger, downgraded
from cascade.service.keys.costs import Prices, tier_prices
from cascade.service.keys.counting import PromptCounter
from cascade.service.keys.keyring import Keyring
from cascade.service.keys.ratelimit import LocalRateLimiter, RateLimiter
from cascade.service.keys.reservation import Reservation, reservation
from cascade.service.keys.tenant import Tenant
from cascade.service.keys.tenants import Tenants
from cascade.service.lease import Lease
from cascade.service.metrics import GatewayMetrics
from cascade.service.reasoning import ReasoningShown
from cascade.service.spans import route_attributes
from cascade.service.telemetry import Telemetry
from cascade.service.traffic import TrafficLog
from cascade.service.validation import (
    check_tier,
    effort_unsent_note,
    forwarded,
    limit_note,
    one_answer_field,
    template_note,
    validate,
)
from cascade.tiers.answer import Answer, Opened, question_of
from cascade.tiers.build import Tier

# Prompts up to this many characters are routed on the event loop (under a millisecond); longer ones in a thread.
INLINE_ROUTING_CHARS = 1024


class ServiceConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What the chat service is built from, all of it config: `[routing]` with a plan's mode and thresholds
    already in, `[gateway]`'s limits, default hint, keep-alive and tier fallback."""

    routing: RoutingConfig = RoutingConfig()
    limits: Limits = Limits()
    default_quality: str = "balanced"
    keepalive_s: float = 2.0
    tier_fallback: bool = True
    prices: Prices | None = None  # the tiers' prices per token (cascade/service/keys/costs.py); None: no costs
    log_requests: bool = False  # `[gateway] log_requests`
    reasoning_fields: tuple[str, ...] = REASONING_FIELDS  # the names answers carry reasoning under

    @classmethod
    def of(cls, config: CascadeConfig, plan: Plan | None = None) -> ServiceConfig:
        """`config`'s; with a `plan`, its mode and its thresholds per hint over `[routing]`'s (the plan was optimised
        for its own mode: route-mode operating points, or cascade-mode acceptance thresholds). A tier priced per
        GPU-hour reads the plan's GPUs for it (ConfigError without)."""
        routing, gateway = config.routing, config.gateway
        if plan is not None:
            thresholds = plan.thresholds_by_hint(len(config.tiers))
            if plan.routing == "cascade":
                routing = msgspec.structs.replace(routing, mode=plan.routing, accept={**routing.accept, **thresholds})
            else:
                routing = msgspec.structs.replace(routing, mode=plan.routing,
                                                  operating_points={**routing.operating_points, **thresholds})
            check_policy_mode(routing, "the plan's mode")
        return cls(routing=routing, limits=gateway.limits, default_quality=gateway.default_quality,
                   keepalive_s=gateway.keepalive_s, tier_fallback=gateway.failover.tier_fallback,
                   prices=tier_prices(config, plan), log_requests=gateway.log_requests,
                   reasoning_fields=gateway.reasoning_fields)

    @property
    def confidence(self) -> AnswerConfidenceConfig:
        return self.routing.confidence


class ChatService:
    def __init__(self, tiers: Sequence[Tier], config: ServiceConfig, metrics: GatewayMetrics, *,
                 signal: RoutingSignal | None = None, traffic: TrafficLog | None = None,
                 engines: TierEngines | None = None, places: SharedPlaces | None = None,
                 limiter: RateLimiter | None = None, ledger: BudgetLedger | None = None,
                 keyring: Keyring | None = None) -> None:
        """`signal`: the routing signal (None: the heuristic); `traffic`: the traffic log (None: off);
        `engines`: the tiers' engines' own load, where read (routing and admission then count every client's);
        `places`: admission places (the gateway's, the tiers', the keys' in-flight) shared with other gateways
        (None: this process's only); `limiter`: the keys' token buckets (None: this process's); `ledger`: the keys'
        budgets (None: this process's); `keyring`: the API keys it serves (None: none, every request passes)."""
        self.tiers = list(tiers)
        self.by_name = {t.name: t for t in self.tiers}
        self.config = config
        self.limits = config.limits
        self.metrics = metrics
        default = parse_hint(config.default_quality, "gateway.default_quality")
        assert default is not None
        self.default_hint: QualityHint = default
        self.admission = Admission(self.tiers, config.limits, metrics, engines, places)
        self.tenants = Tenants(limiter or LocalRateLimiter(), metrics, [t.name for t in self.tiers], places)
        self.budgets = Budgets(ledger or LocalLedger(), metrics, config.prices)
        self.counter = PromptCounter()  # prompts counted for reservations with the tiers' own tokenizers
        self.shown = ReasoningShown(config.reasoning_fields, self.counter)  # answers' reasoning and its tokens
        self.effort = EffortTable(config.routing.effort)  # what reasoning_effort routes as (ConfigError: a bad hint)
        self.keyring = keyring or Keyring()
        self.budgets.publish(self.keyring.tenants)
        shapes = [TierShape(t.name, t.config.branches.slots, t.config.branches.n) for t in self.tiers]
        self.router = Router(shapes, config.routing, signal, self.admission, fallback=config.tier_fallback)
        self.assessor = ProcessAssessor(self.router.policy) if config.routing.assess_long_prompts == "process" else None
        # A target the routing signal cannot meet fails at start, not per request.
        targets = {"gateway.default_quality": default, **{f"routing.effort.{level}.quality": hint
                                                          for level, hint in self.effort.hints.items()}}
        for key, hint in targets.items():
            if hint.target is not None:
                try:
                    self.router.policy.thresholds(hint)
                except InvalidRequest as exc:
                    raise ConfigError(f"`{key}` {hint.label!r}: {exc}") from None
        if self.router.headroom is not None:
            metrics.watch_headroom(self.router.headroom)
        self.telemetry = Telemetry(metrics, traffic, self.router.headroom, config.log_requests)
        self.serving = ServingTiers(self.tiers, config.limits, self.admission, self.telemetry, config.confidence)

    # --- before anything is sent ----------------------------------------------------------------

    def close(self) -> None:
        """Stop what the service started beside its owner's parts: the router's child process, if any."""
        if self.assessor is not None:
            self.assessor.close()

    def model_list(self) -> ModelList:
        ids = [ROUTED_MODEL, *(f"{ROUTED_MODEL}:{h}" for h in NAMED_HINTS), *self.by_name]
        return ModelList(data=[ModelCard(id=i) for i in ids])

    async def intake(self, authorization: str, chunks: AsyncIterator[bytes], declared: str | None
                     ) -> tuple[Tenant | None, ChatCompletionRequest]:
        """Who calls and what it asks, as every adapter reads a chat request: the API key first (`authorization`, the
        header, "" if absent: Unauthorized), then the body from its `chunks` under the size limit (`declared`: its
        Content-Length; PayloadTooLarge) and decoded (InvalidRequest)."""
        caller = self.keyring.authenticate(authorization)
        raw = await read_body(chunks, declared, self.limits.max_body_bytes)
        return caller, decode_chat_request(raw, max_depth=self.limits.max_json_depth)

    async def route(self, req: ChatCompletionRequest, *, caller: Tenant | None = None,
                    hint_header: str | None = None, admit: bool = False) -> RouteDecision:
        """What `chat` would do with `req` for `caller`, without serving it (`POST /v1/route`, the picker): a bad
        request, and a hint or tier the caller may not use, fail the same; a key past its budget's `downgrade_at` is
        routed as its `downgrade_to` asks. `admit` (`/v1/route`, whose routing costs CPU as a chat request's does):
        the decision is admitted as a chat request is, for no tokens (the key's in-flight place and one request from
        its buckets, a gateway place), and refused the same (429), then given back."""
        req, hint_header, note = await self._downgraded(req, hint_header, caller)
        _, decision, _ = await self._decide(req, hint_header, caller)
        if admit:
            lease = Lease(self.admission, self.tenants, caller, self.budgets)
            try:
                await lease.take(Reservation(0, 0.0, 0))
            finally:
                await lease.aclose()
        decision = _noted(decision, note)
        return responses.route_decision(decision, self.tiers)

    async def charge(self, req: ChatCompletionRequest, decision: RouteDecision, caller: Tenant | None) -> None:
        """Charge `caller` for `req` answered once on `decision`'s tier by an engine this service never hears from
        again (the Envoy picker's requests): inside a lease like every request, the key's tokens and budget reserved
        as `chat` would reserve them for one branch, and kept as the charge (the lease is closed at once, its bill
        unknown, so it settles at the reservation). A refusal (RateLimited, QuotaExceeded, LimitsUnavailable) gives
        back what was reserved before it. The key's in-flight place and the gateway's places are not taken: a
        request the service never sees end cannot hold one."""
        if caller is None:
            return
        tier = self.tiers[decision.tier]
        lease = Lease(self.admission, self.tenants, caller, self.budgets)
        try:
            await lease.reserve(await self._reservation(req, caller, [tier], [1]))
            lease.bill.unknown = True  # sent on: the reservation is the charge
        finally:
            await lease.aclose()

    async def chat(self, req: ChatCompletionRequest, *, caller: Tenant | None = None, hint_header: str | None = None,
                   client: Client | None = None) -> ChatReply:
        """Serve `req` for `caller` (its API key; None: keys are off) and `hint_header` (X-Cascade-Quality), inside
        the request's lease.

        A bad request, a permit the key lacks (Forbidden), a full gateway or key (Overloaded, RateLimited) or a fault
        before any answer raises its CascadeError. Whole: the lease is given back and the key billed before this
        returns. Streamed: the stream has started (its first frame is read), and the lease goes back, with its
        upstreams, when its frames end or are closed (`aclose`; the caller must). `client`: whether the client has
        left, read when the work is cancelled or the stream closed early (a disconnect, counted once per request)."""
        req, hint_header, note = await self._downgraded(req, hint_header, caller)
        if note is not None and caller is not None:
            self.metrics.key_budget_downgraded.labels(caller.name).inc()
        req, decision, max_tokens = await self._decide(req, hint_header, caller)
        decision = _noted(decision, note)
        asked = decision.tier.name
        lease = Lease(self.admission, self.tenants, caller, self.budgets)
        frames = None
        try:
            await lease.take(await self._reservation(req, caller, [self.tiers[i] for i in decision.branches],
                                                     [s.n for s in decision.branches.values() if s is not None]))
            headers = dropped_headers(decision.dropped)  # known before the first byte: a stream's headers too
            if not req.stream:
                completion = await self._complete(req, decision, max_tokens, lease)
                return WholeReply(completion, lease.limit_headers() + headers)
            served, opened = await self._open_stream(req, decision, max_tokens, lease)
            frames = self._relayed(opened, asked, client, lease)
            first = await anext(frames)  # started: from here closing `frames` is what gives the lease back
            return StreamReply(served.tier.name, served.itinerary.judges_answers, first, frames,
                               lease.limit_headers() + headers)
        except asyncio.CancelledError:
            if frames is None:  # a started stream counts its own
                self._left(asked, client)
            raise
        finally:
            if frames is None:
                await lease.aclose()

    async def _relayed(self, frames: AsyncGenerator[bytes, None], asked: str, client: Client | None, lease: Lease
                       ) -> AsyncGenerator[bytes, None]:
        ended = False
        try:
            async for frame in frames:
                yield frame
            ended = True
        finally:
            try:
                await frames.aclose()  # the upstreams, the tier's slots and place
            finally:
                await lease.aclose()
                if not ended:
                    self._left(asked, client)

    def _left(self, asked: str, client: Client | None) -> None:
        if client is not None and client.gone:
            self.metrics.disconnects.labels(asked).inc()

    async def _reservation(self, req: ChatCompletionRequest, caller: Tenant | None, reachable: list[Tier],
                           widths: list[int]) -> Reservation:
        """What the caller reserves before dispatch (cascade/service/keys/reservation.py) for a request that may reach
        `reachable` tiers running `widths` branches: priced only for a caller with a budget. The prompt is counted
        with the tiers' tokenizers (cascade/service/keys/counting.py) only for a caller with a token limit or a budget,
        the rest reserving nothing a count would change."""
        priced = caller is not None and caller.budget is not None
        size = len(msgspec.json.encode(req.messages))
        limited = caller is not None and (priced or caller.tokens_per_minute > 0)
        counted = await self.counter.count(req, reachable, size) if limited else None
        return reservation(req, widths, [t.config.default_max_tokens for t in reachable],
                           [t.config.system_prompt for t in reachable], self.budgets.prices if priced else None,
                           [t.name for t in reachable], counted, size)

    async def _downgraded(self, req: ChatCompletionRequest, hint_header: str | None, caller: Tenant | None
                          ) -> tuple[ChatCompletionRequest, str | None, str | None]:
        """`req` and its hint header as the caller's budget has them served, and the note that says so (None: as
        asked). Past `downgrade_at`, a routed request is routed as `downgrade_to` asks (a hint; a tier serves it);
        a request that names its tier keeps it, unless `downgrade_to` is a cheaper tier."""
        found = await self.budgets.downgrade(caller)
        if found is None:
            return req, hint_header, None
        served = downgraded(req, hint_header, found, self.by_name, self.budgets.prices, self.config.default_quality)
        return (req, hint_header, None) if served is None else served

    async def _decide(self, req: ChatCompletionRequest, header_hint: str | None, caller: Tenant | None = None
                      ) -> tuple[ChatCompletionRequest, Decision, int]:
        with tracing.span("cascade.route") as span:  # None: tracing is off
            req, decision, max_tokens = await self._decide_untraced(req, header_hint, caller)
            if span is not None:
                span.set_attributes(route_attributes(decision, self.config.routing.mode, self.admission, caller))
            return req, decision, max_tokens

    async def _decide_untraced(self, req: ChatCompletionRequest, header_hint: str | None,
                               caller: Tenant | None = None) -> tuple[ChatCompletionRequest, Decision, int]:
        """Validate, route, check the caller's permits, and check every tier the request may reach: a bad request
        fails here, before any header. Returns the request as it is served (with the branches its effort sets), the
        decision and the max_tokens to use (0: each tier's default)."""
        max_tokens = validate(req, self.limits)
        routing, effort = await self._route(req, header_hint)
        itinerary, allowed = routing.itinerary, None
        notes = [n for n in (out_of_domain_note(itinerary.route, [t.name for t in self.tiers]),
                             None if effort is None else effort.note, limit_note(req)) if n is not None]
        if effort is not None and effort.branches and req.branches is None:
            req = msgspec.structs.replace(req, branches=BranchOverride(n=effort.branches))
        if caller is not None:
            self.tenants.permit(caller, req.model if routing.hint is None else None, routing.hint)
            allowed = self.tenants.allowed_tiers(caller)
            if allowed is not None:
                if not allowed:
                    raise Forbidden(f"this API key may use tiers {', '.join(sorted(caller.tiers))}, and this gateway "
                                    "serves none of them", "model")
                itinerary = within(itinerary, allowed)
                if itinerary.first != routing.itinerary.first:
                    notes.append(f"served on `{self.tiers[itinerary.first].name}`: this API key may not use "
                                 f"`{self.tiers[routing.itinerary.first].name}`")
        used = forwarded(req)
        branches = {i: check_tier(req, self.tiers[i], self.limits, used) for i in itinerary.reachable()}
        degraded = routing.degraded
        if req.branches is None:  # a request that sets its own branches keeps them
            branched = {i: s for i, s in branches.items() if s is not None}
            cut, degraded = routing.shed({i: (s.n, s.m) for i, s in branched.items()})
            branches |= {i: msgspec.structs.replace(branched[i], n=n) for i, n in cut.items()}
        one_answer = one_answer_field(req)
        if one_answer is not None and any(self.tiers[i].config.branches.n > 1 for i in branches):
            notes.append(f"one branch: `{one_answer}` asks for the engine's answer as it is, not a vote")
        reached = [self.tiers[i] for i in branches]
        unsent = dropped(req, reached)
        for note in (template_note(req, reached), None if effort is None else effort_unsent_note(reached),
                     unsent.note, greedy_note(req, reached)):
            if note is not None:
                notes.append(note)
        decision = Decision(itinerary=itinerary, tier=self.tiers[itinerary.first], hint=routing.label,
                            note="; ".join(notes) or None, degraded=degraded, branches=branches, allowed=allowed,
                            effort=None if effort is None else effort.effort, dropped=unsent.names)
        self.telemetry.degraded(decision)
        return req, decision, max_tokens

    async def _route(self, req: ChatCompletionRequest, header_hint: str | None) -> tuple[Routing, EffortUse | None]:
        """The request's routing, and what its reasoning effort does (None: it set none). The hint is the one
        `pick_hint` picks (cascade/router/effort.py: the one place the precedence is decided)."""
        model = req.model
        # Hints are checked even when a tier name makes them moot: a bad value is the client's mistake.
        body_hint, header = parse_hint(req.quality, "quality"), parse_hint(header_hint, "X-Cascade-Quality")
        effort = read_effort(req.reasoning_effort, req.reasoning)
        asked = None if effort is None else effort_hint(effort, self.effort)
        if model in self.by_name:
            return (self.router.pinned(self.by_name[model].index),
                    None if asked is None else effort_use(asked, None, None))
        base, _, alias = model.partition(":")
        if base != ROUTED_MODEL:
            raise UnknownModel(model, [m.id for m in self.model_list().data])
        hint, source = pick_hint(body_hint, header, parse_hint(alias or None, "model"), asked, self.default_hint)
        start = time.perf_counter()
        prompt = question_of(req.messages)
        # The router reads at most `max_prompt_chars` (router.py `routed_text`): 0.6-5 us per character with the
        # embedded learned router, so a long prompt is assessed off the loop: in the router's child process
        # (cascade/router/offload.py), or in a worker thread.
        if len(prompt) <= INLINE_ROUTING_CHARS:
            assessed = self.router.assess(prompt)
        elif self.assessor is not None:
            assessed = await self.assessor.assess(self.router.routed(prompt))
        else:
            assessed = await asyncio.to_thread(self.router.assess, prompt)
        routing = self.router.decide(assessed, hint)
        self.metrics.decision_latency.observe(time.perf_counter() - start)
        route = routing.itinerary.route
        if route is not None and route.assessment.out_of_domain:
            self.metrics.out_of_domain.inc()
        return routing, None if asked is None else effort_use(asked, source, hint)

    # --- answering --------------------------------------------------------------------------------

    async def _complete(self, req: ChatCompletionRequest, decision: Decision, max_tokens: int, lease: Lease
                        ) -> ChatCompletion:
        start = time.perf_counter()
        decision, whole = await WholeAnswerer(self.serving, req, decision, max_tokens, lease).serve()
        usage = responses.usage_of(whole)
        self.telemetry.success(decision, time.perf_counter() - start, usage.prompt_tokens, usage.completion_tokens,
                               whole)
        reasoning = await self.shown.of(decision.tier, whole.results)
        return responses.completion(decision, whole, lease.bill.billed(), lease.bill.cost(), self.shown.names,
                                    reasoning)

    async def _open_stream(
        self, req: ChatCompletionRequest, decision: Decision, max_tokens: int, lease: Lease
    ) -> tuple[Decision, AsyncGenerator[bytes, None]]:
        """Start the upstream streams and wait for their first delta, so that a backend fault becomes
        an HTTP error status (or a fallback to another tier) instead of a broken 200 stream. Returns the
        decision that will answer and the SSE frame iterator, not started (`chat` starts it)."""
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        keepalive_s = self.config.keepalive_s
        # The first tier is reachable: its branch settings were checked in `_decide`.
        if decision.itinerary.judges_answers or decision.branches[decision.tier.index] is not None:
            # Served whole: the first tier's admission is decided here, before any header (a full tier is a 429);
            # only the wait for branch slots, and any later tier, come after the keep-alives start.
            whole = WholeAnswerer(self.serving, req, decision, max_tokens, lease)
            await whole.hold_first()
            return decision, streaming.deferred(whole.serve(), keepalive_s, include_usage, self.telemetry, lease.bill,
                                                self.shown)
        live = StreamAnswerer(self.serving, req, decision, max_tokens, lease)
        decision, opened = await live.serve()
        if isinstance(opened, Opened):
            return decision, streaming.relay(opened, live, decision, include_usage, self.telemetry, lease.bill,
                                             self.shown)
        # A route-mode fallback to a tier with branches: they vote, so it is served whole, as on a branched tier.
        return decision, streaming.deferred(_answered(decision, opened), keepalive_s, include_usage, self.telemetry,
                                            lease.bill, self.shown)


def _noted(decision: Decision, note: str | None) -> Decision:
    """`decision` with `note` first in its `cascade.note`."""
    if note is None:
        return decision
    return msgspec.structs.replace(decision, note=note if decision.note is None else f"{note}; {decision.note}")


async def _answered(decision: Decision, answer: Awaitable[Answer]) -> tuple[Decision, Answer]:
    return decision, await answer


class Client(Protocol):
    """The client's side of a request, as the service reads it: whether the client has left."""

    @property
    def gone(self) -> bool: ...


@dataclass(frozen=True)
class WholeReply:
    """A whole answer: its completion names the tier that served it (`model`) and carries its bill
    (`cascade.billed`); `headers`: the key's rate-limit headers (x-ratelimit-*)."""

    completion: ChatCompletion
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


@dataclass(frozen=True)
class StreamReply:
    """A started SSE stream: `first` frame read, the rest in `frames`, which the caller must `aclose` (closing it
    closes the upstreams and gives the request's place back)."""

    tier: str  # the tier that answers (cascade mode: the first asked; the chunks name the one that answered)
    judged: bool  # cascade mode: the answering tier is known only at the end
    first: bytes
    frames: AsyncGenerator[bytes, None]
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # the key's rate-limit headers


ChatReply = WholeReply | StreamReply
