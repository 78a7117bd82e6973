"""The random-route null (`[routing] policy = "random"`) serving through the gateway, over real HTTP in front of the
fake engine: it routes, answers and says it was random; numeric hints need the tiers' accuracies."""

from __future__ import annotations

import httpx
import pytest

from cascade.config import decode_config
from cascade.errors import ConfigError
from cascade.gateway.server import Gateway
from cascade.plan import OperatingPoint, Plan
from cascade.router.policy import tier_for
from cascade.router.random_split import random_score, random_thresholds
from cascade.service.chat import ServiceConfig
from cascade.testing.servers import TIERS, ladder_toml
from tests.gateway.gateway_setup import post_chat, running_gateway, user

SEED = 11
RANDOM = f'[routing]\npolicy = "random"\n[routing.random]\nseed = {SEED}\n'
ACCURACIES = [0.3, 0.55, 0.8]
CALIBRATED = RANDOM + f"accuracies = {ACCURACIES}\n"
PROMPT = "A school has 17 classes with 23 students in each class. How many students are in the school?"


def route(base: str, text: str, quality: str | float) -> httpx.Response:
    return httpx.post(f"{base}/v1/route", json={"model": "cascade", "quality": quality, "messages": user(text)},
                      timeout=10)


def test_the_random_policy_routes_by_the_prompts_keyed_hash_and_serves_saying_so() -> None:
    with running_gateway(extra=RANDOM) as (base, _, engine):
        decision = route(base, PROMPT, "balanced").json()
        assert decision["router"] == "random" and decision["out_of_domain"] is False
        # The response rounds to 4 decimals.
        assert decision["route_score"] == decision["difficulty"] == pytest.approx(random_score(PROMPT, SEED), abs=1e-4)
        assert decision["thresholds"] == pytest.approx([1 / 3, 2 / 3])  # the default `balanced`: an even split
        assert decision["tier"] == tier_for(random_score(PROMPT, SEED), [1 / 3, 2 / 3])
        assert engine.stats.requests == 0  # routing only
        for _ in range(3):  # the same prompt, the same tier
            assert route(base, PROMPT, "balanced").json()["tier"] == decision["tier"]
        assert route(base, PROMPT, "fast").json()["tier"] == 0 and route(base, PROMPT, "best").json()["tier"] == 2
        response = post_chat(base, {"model": "cascade:balanced", "messages": user(PROMPT)})
        assert response.status_code == 200, response.text
        info = response.json()["cascade"]
        assert info["router"] == "random" and info["tier"] == decision["tier"]
        assert response.headers["x-cascade-tier"] == TIERS[decision["tier"]]


def test_a_numeric_hint_without_the_tiers_accuracies_is_a_400_naming_the_quality() -> None:
    with running_gateway(extra=RANDOM) as (base, _, engine):
        for response in (route(base, PROMPT, 0.7),
                         post_chat(base, {"model": "cascade", "quality": 0.7, "messages": user(PROMPT)}),
                         post_chat(base, {"model": "cascade:0.7", "messages": user(PROMPT)})):
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "quality" and "[routing.random] accuracies" in error["message"]
        assert engine.stats.requests == 0


def test_a_numeric_hint_with_the_tiers_accuracies_gets_the_cheapest_split_reaching_it() -> None:
    with running_gateway(extra=CALIBRATED) as (base, _, _):
        decision = route(base, PROMPT, 0.7).json()
        thresholds = random_thresholds(ACCURACIES, [0, 1, 2], 0.7)
        assert decision["router"] == "random"
        assert thresholds == [0.0, pytest.approx(0.4)]  # 0.4 of tier 1, 0.6 of tier 2
        assert decision["thresholds"] == pytest.approx(thresholds, abs=1e-4)
        assert decision["tier"] == tier_for(random_score(PROMPT, SEED), thresholds)
        response = post_chat(base, {"model": "cascade", "quality": 0.7, "messages": user(PROMPT)})
        assert response.status_code == 200 and response.json()["cascade"]["tier"] == decision["tier"]


def test_a_numeric_default_hint_the_random_policy_cannot_meet_fails_at_start() -> None:
    toml = ladder_toml("http://127.0.0.1:9", '[gateway]\ndefault_quality = "0.8"\n' + RANDOM)
    with pytest.raises(ConfigError, match=r"gateway\.default_quality.*\[routing\.random\] accuracies"):
        Gateway(decode_config(toml))


def test_a_cascade_mode_plan_is_refused_with_the_random_policy() -> None:
    config = decode_config(ladder_toml("http://127.0.0.1:9", RANDOM))
    plan = Plan(tiers=list(TIERS), routing="cascade",
                operating_points=[OperatingPoint(hint="balanced", thresholds=[0.5, 0.5])])
    with pytest.raises(ConfigError, match="the plan's mode"):
        ServiceConfig.of(config, plan)
    route_plan = Plan(tiers=list(TIERS), operating_points=[OperatingPoint(hint="balanced", thresholds=[0.2, 0.9])])
    assert ServiceConfig.of(config, route_plan).routing.operating_points["balanced"] == [0.2, 0.9]
