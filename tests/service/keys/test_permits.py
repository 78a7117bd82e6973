"""A key's permits (`hints`, `tiers`) on every path: the gateway's chat completions, `/v1/route`, the ext_proc picker
and the picker sending a request on to the gateway; and to the tier that finally serves, routed, escalated or fallen
back to (cascade/router/escalation.py `within`)."""

from __future__ import annotations

import asyncio
import hashlib
import json

import httpx
import msgspec
import pytest

from cascade.config import decode_config
from cascade.errors import Forbidden
from cascade.extproc.picker import Refused, Routed, TierPicker
from cascade.router.acceptance import NEVER
from cascade.router.escalation import Cascaded, Pinned, within
from cascade.router.escalation import Routed as RoutedItinerary
from cascade.router.policy import Assessment, Route
from cascade.service.keys.tenant import Tenant
from cascade.testing.fakes.engine import FakeScript
from cascade.testing.servers import TIERS
from tests.extproc.extproc_setup import TOML, chat
from tests.gateway.gateway_setup import post_chat, running_gateway, user
from tests.service.test_lease import key, request, with_service

PLAIN = "csk-permits-test-key-0123456789abcdef"


def route(tier: int) -> Route:
    return Route(tier=tier, assessment=Assessment(difficulty=0.5, score=0.5), thresholds=[0.3, 0.6], router="test")


# --- the itinerary kept to the key's tiers ---------------------------------------------------------------------


@pytest.mark.parametrize(("routed", "allowed", "served"), [
    (2, {0, 1}, 1),  # the nearest allowed tier below: the key asked for no more than it may use
    (2, {0}, 0),
    (0, {2}, 2),  # none below: the cheapest above
    (1, {0, 2}, 0),
    (1, {1}, 1),
])
def test_a_routed_request_goes_to_the_nearest_allowed_tier_cheaper_first(routed: int, allowed: set[int],
                                                                         served: int) -> None:
    itinerary = within(RoutedItinerary(route(routed), 3), frozenset(allowed))
    assert itinerary.first == served and list(itinerary.reachable()) == [served]


def test_a_cascade_climbs_only_allowed_tiers_and_its_highest_accepts() -> None:
    cascade = Cascaded(route(0), accept=[0.5, 0.5])  # three tiers
    assert within(cascade, frozenset({0, 1})).thresholds == [0.5]  # tier 1 is now the top: it accepts
    assert within(cascade, frozenset({0, 2})).thresholds == [0.5, NEVER]  # tier 1 skipped
    only_top = within(cascade, frozenset({2}))
    assert only_top.first == 2 and list(only_top.reachable()) == [2]
    best = within(Cascaded(route(0), accept=[NEVER, NEVER]), frozenset({0, 1}))
    assert best.first == 1 and list(best.reachable()) == [1]  # `best` on the highest tier the key may use


def test_a_pinned_tier_is_left_to_the_permit_check() -> None:
    assert within(Pinned(2), frozenset({0})).first == 2


# --- the service: chat and route ----------------------------------------------------------------------------------


def test_routing_is_kept_to_the_keys_tiers_and_says_so() -> None:
    caller = key(tiers=frozenset({TIERS[0]}))

    async def work(service):  # type: ignore[no-untyped-def]
        decision = await service.route(request(model="cascade:best"), caller=caller)
        reply = await service.chat(request(model="cascade:best"), caller=caller)
        return decision, reply.completion

    decision, completion = with_service(work)
    assert decision.tier_name == completion.model == TIERS[0]
    assert completion.cascade.note == f"served on `{TIERS[0]}`: this API key may not use `{TIERS[2]}`"


def test_a_route_mode_fallback_goes_only_to_a_tier_the_key_may_use() -> None:
    async def work(service):  # type: ignore[no-untyped-def]
        failing = request(model="cascade:best", messages=user("[fake@fake-2 status=500] hi"))
        free = await service.chat(failing, caller=key())
        kept = await service.chat(failing, caller=key("kept", tiers=frozenset({TIERS[0], TIERS[2]})))
        return free.completion, kept.completion

    free, kept = with_service(work)
    assert free.model == TIERS[1] and free.cascade.fallback_from == TIERS[2]
    assert kept.model == TIERS[0] and kept.cascade.fallback_from == TIERS[2]  # not TIERS[1]


def test_cascade_mode_never_escalates_past_the_keys_tiers() -> None:
    caller = key(tiers=frozenset({TIERS[0]}))

    async def work(service):  # type: ignore[no-untyped-def]
        cut = request(model="cascade:balanced", messages=user("[fake@fake-0 tokens=100] What is 2 + 2?"))
        return (await service.chat(cut, caller=caller)).completion

    completion = with_service(work, mode="cascade")
    assert completion.model == TIERS[0] and completion.cascade.escalations == 0  # its draft stands


@pytest.mark.parametrize(("permits", "body", "param"), [
    ({"hints": frozenset({"fast"})}, {"model": "cascade:best"}, "quality"),
    ({"hints": frozenset({"fast"})}, {"model": "cascade", "quality": 0.9}, "quality"),
    ({"tiers": frozenset({TIERS[0]})}, {"model": TIERS[1]}, "model"),
])
def test_route_and_chat_refuse_what_the_key_may_not_use(permits: dict, body: dict, param: str) -> None:
    caller = key(**permits)

    async def work(service):  # type: ignore[no-untyped-def]
        refused = []
        for call in (service.route, service.chat):
            with pytest.raises(Forbidden) as info:
                await call(request(**body), caller=caller)
            refused.append(info.value.param)
        return refused

    assert with_service(work) == [param, param]


def test_the_http_route_endpoint_applies_the_keys_permits() -> None:
    digest = hashlib.sha256(PLAIN.encode()).hexdigest()
    keys = f'[[gateway.keys]]\nname = "fast-only"\nsha256 = "{digest}"\nhints = ["fast"]\ntiers = ["{TIERS[0]}"]\n'
    with running_gateway(FakeScript(tokens=4), extra=keys) as (base, _, _engine):
        auth = {"authorization": f"Bearer {PLAIN}"}
        best = httpx.post(f"{base}/v1/route", json={"model": "cascade:best", "messages": user()}, headers=auth)
        fast = httpx.post(f"{base}/v1/route", json={"model": "cascade:fast", "messages": user()}, headers=auth)
        pinned = httpx.post(f"{base}/v1/route", json={"model": TIERS[2], "messages": user()}, headers=auth)
        served = post_chat(base, {"model": "cascade:fast", "messages": user()}, auth)
    assert best.status_code == 403 and best.json()["error"]["param"] == "quality"
    assert fast.status_code == 200 and fast.json()["tier_name"] == TIERS[0]
    assert pinned.status_code == 403 and pinned.json()["error"]["param"] == "model"
    assert served.status_code == 200 and int(served.headers["x-cascade-billed-tokens"]) > 4


# --- the ext_proc picker, alone and in front of a gateway -----------------------------------------------------------


def picker_with_key(permits: str, *, gateway: bool = False) -> TierPicker:
    digest = hashlib.sha256(PLAIN.encode()).hexdigest()
    extra = f'[[gateway.keys]]\nname = "k"\nsha256 = "{digest}"\n{permits}\n'
    return TierPicker(decode_config(extra + TOML), gateway=gateway)


def pick(picker: TierPicker, body: bytes) -> Routed | Refused | None:
    headers = {":path": "/v1/chat/completions", ":method": "POST", "authorization": f"Bearer {PLAIN}"}
    return asyncio.run(picker.pick(headers, body))


def test_the_picker_applies_hints_and_keeps_the_pick_to_the_keys_tiers() -> None:
    fast_only = picker_with_key('hints = ["fast"]')
    refused = pick(fast_only, chat(quality="best"))
    assert isinstance(refused, Refused) and refused.status == 403
    assert json.loads(refused.body)["error"]["param"] == "quality"
    small_only = picker_with_key('tiers = ["small"]')
    verdict = pick(small_only, chat(quality="best"))
    assert isinstance(verdict, Routed) and verdict.tier == "small"


def test_the_picker_sending_on_to_the_gateway_checked_the_hint_and_names_a_tier_the_key_may_use() -> None:
    picker = picker_with_key('hints = ["fast", "best"]\ntiers = ["small", "medium"]', gateway=True)
    branched = {"model": "cascade:best", "branches": {"n": 2}, "messages": user()}
    verdict = pick(picker, msgspec.json.encode(branched))
    assert isinstance(verdict, Routed) and verdict.via_gateway and verdict.tier == "medium"  # not `large`
    assert json.loads(verdict.body)["model"] == "medium"  # the gateway serves that tier: the key may use it
    balanced = pick(picker, msgspec.json.encode({**branched, "model": "cascade:balanced"}))
    assert isinstance(balanced, Refused) and balanced.status == 403  # never reaches the gateway


def test_a_tenant_with_no_tier_of_this_gateway_is_refused() -> None:
    async def work(service):  # type: ignore[no-untyped-def]
        with pytest.raises(Forbidden, match="serves none of them"):
            await service.route(request(), caller=key(tiers=frozenset({"elsewhere"})))

    with_service(work)


def test_tenants_default_to_every_tier() -> None:
    assert Tenant("t", b"").tiers == frozenset()
