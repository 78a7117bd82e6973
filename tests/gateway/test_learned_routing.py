"""The gateway routing with a learned router trained by `cascade router train`, over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from cascade.config import decode_config
from cascade.errors import ConfigError
from cascade.gateway.server import Gateway
from cascade.testing.servers import TIERS, ladder_toml
from tests.gateway.gateway_setup import post_chat, running_gateway, user
from tests.learned_router import EASY, HARD


def learned(router_dir: Path) -> str:
    return f'[routing]\npolicy = "learned"\nrouter = "{router_dir}"\n'


def route(base: str, text: str, quality: str | float | None = None) -> dict:
    body: dict = {"model": "cascade", "messages": user(text)}
    if quality is not None:
        body["quality"] = quality
    response = httpx.post(f"{base}/v1/route", json=body, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["x-cascade-tier"] == response.json()["tier_name"]
    return response.json()


def test_route_endpoint_reports_p_fail_per_tier_and_the_calibrated_thresholds(router_dir) -> None:
    with running_gateway(extra=learned(router_dir)) as (base, _, engine):
        easy, hard = route(base, EASY, "balanced"), route(base, HARD, "balanced")
        assert easy["router"] == hard["router"] == "learned" and easy["object"] == "cascade.route"
        assert set(easy["p_fail"]) == set(TIERS) and len(easy["thresholds"]) == 2
        assert hard["difficulty"] > easy["difficulty"] and hard["route_score"] > easy["route_score"]
        assert hard["tier"] > easy["tier"]
        assert engine.stats.requests == 0  # routing only: nothing was generated


def test_named_hints_order_tiers_and_a_numeric_target_is_honoured(router_dir) -> None:
    with running_gateway(extra=learned(router_dir)) as (base, _, _):
        tiers = [route(base, HARD, hint)["tier"] for hint in ("fast", "balanced", "best")]
        assert tiers == sorted(tiers) and tiers[-1] > tiers[0]
        assert route(base, HARD, 0.05)["tier"] <= route(base, HARD, 0.99)["tier"]


def test_chat_completion_reports_the_learned_decision(router_dir) -> None:
    with running_gateway(extra=learned(router_dir)) as (base, _, _):
        decision = route(base, HARD, "balanced")
        response = post_chat(base, {"model": "cascade:balanced", "messages": user(HARD)})
        info = response.json()["cascade"]
        assert response.status_code == 200 and info["router"] == "learned"
        assert info["tier"] == decision["tier"] and info["route_score"] == decision["route_score"]


def test_config_thresholds_override_the_calibration(router_dir) -> None:
    extra = learned(router_dir) + "operating_points = { balanced = [0.0, 0.0] }\n"
    with running_gateway(extra=extra) as (base, _, _):
        assert route(base, EASY, "balanced")["tier"] == 2


def test_route_rejects_bad_input_with_an_openai_error(router_dir) -> None:
    with running_gateway(extra=learned(router_dir)) as (base, _, _):
        response = httpx.post(f"{base}/v1/route", json={"model": "cascade", "messages": user(), "quality": 7},
                              timeout=10)
        assert response.status_code == 400 and response.json()["error"]["param"] == "quality"
        response = httpx.post(f"{base}/v1/route", json={"model": "nope", "messages": user()}, timeout=10)
        assert response.status_code == 404


def test_a_router_for_other_tiers_is_refused_at_start(router_dir) -> None:
    toml = ladder_toml("http://127.0.0.1:9", learned(router_dir)).replace('"tier-large"', '"tier-xl"')
    with pytest.raises(ConfigError, match="trained for tiers"):
        Gateway(decode_config(toml))


def test_learned_policy_without_a_router_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"routing\.router"):
        decode_config(ladder_toml("http://127.0.0.1:9", '[routing]\npolicy = "learned"\n'))


def test_cascade_mode_accepts_on_the_learned_prior_and_escalates_below_it(router_dir) -> None:
    extra = learned(router_dir) + 'mode = "cascade"\naccept = { balanced = [0.5, 0.5] }\n'
    with running_gateway(extra=extra) as (base, _, _):
        easy, hard = route(base, EASY, "balanced"), route(base, HARD, "balanced")
        assert easy["thresholds"] == [0.5, 0.5]
        for decision, text in ((easy, EASY), (hard, HARD)):
            info = post_chat(base, {"model": "cascade:balanced", "messages": user(text)}).json()["cascade"]
            p_ok = [1 - decision["p_fail"][t] for t in TIERS]
            expected = next((t for t in range(2) if p_ok[t] >= 0.5), 2)
            assert info["tier"] == expected and info["escalations"] == expected
            assert info["confidence"] == pytest.approx(p_ok[expected], abs=1e-3)
        assert 1 - hard["p_fail"][TIERS[0]] < 0.5  # the hard prompt did escalate


def test_a_prompt_unlike_the_training_prompts_is_routed_by_the_heuristic_and_says_so(router_dir, tmp_path) -> None:
    chat = "Say hello."
    log = tmp_path / "traffic.jsonl"
    with running_gateway(extra=f'[gateway]\ntraffic_log = "{log}"\n' + learned(router_dir)) as (base, _, _):
        in_domain = route(base, EASY, "balanced")
        assert in_domain["out_of_domain"] is False and in_domain["note"] is None
        for hint, expected_tier in (("fast", 0), ("balanced", 0), ("best", 2)):
            decision = route(base, chat, hint)
            assert decision["out_of_domain"] is True and decision["router"] == "heuristic"
            assert decision["tier"] == expected_tier
            assert set(decision["p_fail"]) == set(TIERS)  # what the learned router said is still reported
            # ... and why the tier is not the one that p_fail would pick (issue 65 item 5)
            assert decision["note"].startswith("out of domain:")
            assert f"chose `{decision['tier_name']}`" in decision["note"]
        # the heuristic's own default thresholds, not the learned router's calibrated ones
        assert route(base, chat, "balanced")["thresholds"] == pytest.approx([1 / 3, 2 / 3])
        info = post_chat(base, {"model": "cascade:balanced", "messages": user(chat)}).json()["cascade"]
        assert info["out_of_domain"] is True and info["router"] == "heuristic" and info["tier"] == 0
        assert info["note"].startswith("out of domain:")
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert "cascade_router_out_of_domain_total 5.0" in metrics  # 4 routing decisions and 1 completion
        post_chat(base, {"model": "cascade:balanced", "messages": user(EASY)})
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["router"], r.get("out_of_domain", False)) for r in records] == [("heuristic", True), ("learned", False)]


def test_cascade_mode_does_not_use_the_learned_prior_of_an_out_of_domain_prompt(router_dir) -> None:
    extra = learned(router_dir) + 'mode = "cascade"\naccept = { balanced = [0.5, 0.5] }\n'
    with running_gateway(extra=extra) as (base, _, _):
        decision = route(base, "Say hello.", "balanced")
        assert decision["out_of_domain"] is True
        info = post_chat(base, {"model": "cascade:balanced", "messages": user("Say hello.")}).json()["cascade"]
        # a complete answer on the first tier is accepted: no extrapolated p_fail decides an escalation
        assert info["tier"] == 0 and info["escalations"] == 0 and info["confidence"] == 1.0
        assert info["out_of_domain"] is True
