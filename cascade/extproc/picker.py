"""The model picker: a chat completion's headers and body in, where Envoy sends it out. No gRPC here.

    picker = TierPicker(config, plan)                    # once: the gateway's own ChatService, in route mode
    verdict = await picker.pick(headers, body)           # per request: Routed, Refused, or None (not a chat)

Every check and the decision are `cascade serve`'s own, from the same assembly (cascade/service/assemble.py):
`ChatService.intake` (the API key, the body limit, decoding), `ChatService.route` (validation, the quality hint: body,
`X-Cascade-Quality`, `cascade:<hint>`, default; the router, heuristic, learned or random, with `[routing]`'s and the
plan's operating points; the key's permits: the hint it asks with, the tier it names, and the tiers that may serve it,
which the pick is kept to; the checks of the tiers it picks), then `ChatService.charge` (the key's rate limits and
budget; last, and only for a request sent to an engine: one the gateway serves is counted and billed by the gateway
alone).
A failure is `Refused` with the gateway's status, OpenAI error body and headers. The chat path is recognised in the
gateway's normal form (cascade/service/paths.py: `/v1/chat/%63ompletions` is it, `/v1/chat%2Fcompletions` is not), and a
request routed from another spelling has its `:path` set to the plain one, which Envoy's routes match.

Billing: a request sent to an engine is charged its reservation (the prompt estimate and max_tokens, the tier's
default where the client set none, for each of its n choices), never settled to its usage: the picker sees requests,
not responses (Envoy sends it no response body: buffering or streaming every answer through it would put each token
through gRPC), so it charges the most a request can cost. The charge goes through a request's lease like every other
path (cascade/service/lease.py), so a refusal by the budget gives back the tokens reserved before it. Requests sent
on to the gateway are billed there, exactly. A key's budget (`[[gateway.keys]] budget`) is charged the same way: the
reservation priced at the tier's price. A key's `max_in_flight` counts only at gateways (the picker never sees a
request end).

Each verdict on a chat completion is counted in `picker.metrics` (its tier or status, and its time:
cascade/extproc/metrics.py).

`Routed` names the tier (`x-cascade-tier`, which Envoy's routes match) and carries the body rewritten as `cascade
serve` would send it to that tier's engine: `model` the engine's, the tier's system prompt first, the tier's
default `max_tokens` when the client set none, without cascade's own fields (`quality`, `branches`); the engines'
credentials replace the client's. With a gateway behind Envoy (`gateway=True`), a request for reasoning branches
(it sets `branches`, or its tier runs them) goes to the gateway instead (`x-cascade-via: gateway`), its body
naming the picked tier as its model so that the gateway serves that tier without deciding again.

Route mode only, and the router alone decides: load-reactive routing is off (the replicas' load is stage 2's, the
endpoint picker of each tier's pool), and a cascade-mode plan is refused (its thresholds are acceptance thresholds).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping

import msgspec

from cascade.config import CascadeConfig
from cascade.errors import CascadeError, ConfigError, InvalidRequest
from cascade.extproc.engines import TierEngine, tier_engines
from cascade.extproc.metrics import ExtprocMetrics
from cascade.extproc.wire import CHAT_PATH, HINT_HEADER, TIER_HEADER, VIA_HEADER
from cascade.plan import Plan
from cascade.router.effort import effort_hint, read_effort
from cascade.router.policy import RoutingSignal
from cascade.schemas import ChatCompletionRequest, RouteDecision
from cascade.service.assemble import assemble
from cascade.service.chat import ServiceConfig
from cascade.service.errors import error_reply, error_response
from cascade.service.paths import normalize_path
from cascade.tiers.build import build_tiers
from cascade.tiers.upstream import engine_body

log = logging.getLogger("cascade.extproc")

_encode = msgspec.json.Encoder().encode


class Routed(msgspec.Struct, frozen=True, kw_only=True):
    """Send the request on to `tier` (its engines, or the gateway), with these headers and this body."""

    tier: str
    via_gateway: bool
    body: bytes
    set_headers: tuple[tuple[str, str], ...]
    remove_headers: tuple[str, ...]
    decision: RouteDecision
    key: str | None = None  # the API key's configured name, when keys are configured


class Refused(msgspec.Struct, frozen=True, kw_only=True):
    """Answer the client at once: `status`, an OpenAI error body, extra headers (Retry-After, Allow)."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


Verdict = Routed | Refused | None  # None: not a chat completion, left as it is


class TierPicker:
    def __init__(self, config: CascadeConfig, plan: Plan | None = None, *, gateway: bool = False,
                 signal: RoutingSignal | None = None) -> None:
        """`gateway`: a `cascade serve` sits behind Envoy for reasoning branches; `signal`: the routing signal
        (default: the config's, as `cascade serve` loads it)."""
        if plan is not None and plan.routing == "cascade":
            raise ConfigError("the plan is for cascade mode (escalation), which only `cascade serve` runs: give "
                              "cascade extproc a route-mode plan (the problem's `[routing] mode = \"route\"`)")
        if config.routing.mode == "cascade":
            log.info("[routing] mode = \"cascade\" is the gateway's: cascade extproc routes (one tier per request)")
        self.engines = tier_engines(config)
        self.gateway = gateway
        tiers = build_tiers(config, {})  # no backend is ever called: ChatService checks requests against them
        names = [t.name for t in tiers]
        if not gateway and (branched := [t.name for t in tiers if t.config.branches.n > 1]):
            log.warning("tier(s) %s run reasoning branches in `cascade serve`; without --gateway their engines "
                        "answer each request once", ", ".join(branched))
        service = ServiceConfig.of(config, plan)
        routing = msgspec.structs.replace(
            service.routing, mode="route", load=msgspec.structs.replace(service.routing.load, enabled=False))
        # The gateway's own assembly (cascade/service/assemble.py), routing only: a key's buckets and budget in Redis,
        # shared with the gateways, when `[gateway.redis] url` is set, else this process's.
        parts = assemble(config, tiers, msgspec.structs.replace(service, routing=routing), serves=False, signal=signal)
        self.service, self.redis = parts.service, parts.redis
        # The picker's own series (`cascade_extproc_*`) and, from the gateway's registry, the keys' refusals and the
        # Redis store's health: served on --metrics-port.
        self.metrics = ExtprocMetrics(names, shared=parts.metrics.registry)

    async def start(self) -> None:
        if self.redis is not None:
            await self.redis.start()

    async def aclose(self) -> None:
        self.service.close()
        if self.redis is not None:
            await self.redis.aclose()

    async def pick(self, headers: Mapping[str, str], body: bytes) -> Verdict:
        """`headers`: the request's, lower-case names, pseudo-headers (`:path`, `:method`) included."""
        target = headers.get(":path", "")
        path, mark, query = target.partition("?")
        if normalize_path(path) != CHAT_PATH:  # the gateway's normal form (cascade/service/paths.py)
            return None
        start = time.perf_counter()
        verdict = await self._verdict(headers, body)
        if isinstance(verdict, Routed) and path != CHAT_PATH:  # so that Envoy's routes, matching it exactly, match
            verdict = msgspec.structs.replace(verdict, set_headers=(*verdict.set_headers,
                                                                    (":path", CHAT_PATH + mark + query)))
        self.metrics.observe(time.perf_counter() - start)
        if isinstance(verdict, Routed):
            self.metrics.decided(verdict.tier, via_gateway=verdict.via_gateway, key=verdict.key)
        else:
            self.metrics.refused(verdict.status)
        return verdict

    async def _verdict(self, headers: Mapping[str, str], body: bytes) -> Routed | Refused:
        method = headers.get(":method", "POST")
        if method != "POST":
            message = f"method {method} is not allowed on {CHAT_PATH}"
            return Refused(status=405, body=error_response(message, "invalid_request_error"),
                           headers=(("allow", "POST"),))
        try:
            return await self._pick(headers, body)
        except CascadeError as exc:
            status, error, extra = error_reply(exc, self.service.metrics, method, CHAT_PATH)
            return Refused(status=status, body=error,
                           headers=tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in extra))

    async def _pick(self, headers: Mapping[str, str], body: bytes) -> Routed:
        tenant, req = await self.service.intake(headers.get("authorization", ""), _chunks(body),
                                                headers.get("content-length"))
        hint = headers.get(HINT_HEADER)
        decision = await self.service.route(req, caller=tenant, hint_header=hint)
        if self.gateway and (req.branches is not None or self.service.tiers[decision.tier].config.branches.n > 1):
            return self._to_gateway(req, decision)  # the gateway checks the key's limits itself: counted once
        if req.branches is not None:
            raise InvalidRequest("`branches` runs in `cascade serve`, and no gateway is behind this proxy: leave "
                                 "`branches` out", "branches")
        await self.service.charge(req, decision, tenant)  # last: nothing can fail after it (the module says why)
        return self._to_engine(req, decision, self.engines[decision.tier], key=None if tenant is None else tenant.name)

    def _to_engine(self, req: ChatCompletionRequest, decision: RouteDecision, engine: TierEngine,
                   key: str | None = None) -> Routed:
        effort = read_effort(req.reasoning_effort, req.reasoning)  # what the engine is told of it (the service's rule)
        told = None if effort is None else effort_hint(effort, self.service.effort).effort
        body = engine_body(req, self.service.tiers[decision.tier].config, engine.model, told)
        credentials = () if engine.authorization is None else (("authorization", engine.authorization),)
        return Routed(tier=engine.tier, via_gateway=False, body=body,
                      set_headers=((TIER_HEADER, engine.tier), ("content-length", str(len(body))), *credentials),
                      remove_headers=(VIA_HEADER, *(() if credentials else ("authorization",))), decision=decision,
                      key=key)

    def _to_gateway(self, req: ChatCompletionRequest, decision: RouteDecision) -> Routed:
        body = _encode(msgspec.structs.replace(req, model=decision.tier_name))  # the gateway serves that tier
        return Routed(tier=decision.tier_name, via_gateway=True, body=body,
                      set_headers=((TIER_HEADER, decision.tier_name), (VIA_HEADER, "gateway"),
                                   ("content-length", str(len(body)))),
                      remove_headers=(), decision=decision)


async def _chunks(body: bytes) -> AsyncIterator[bytes]:
    yield body
