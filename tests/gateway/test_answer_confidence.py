"""Confidence from the answer itself through the gateway (real HTTP, the fake engine on 127.0.0.1): cascade mode
reads the answer's token logprobs, which it asks the engine for and never shows a client that did not ask; a tier
whose engine returns none keeps the router's prior; a reasoning tier prunes unsure branches without a scorer."""

from __future__ import annotations

import json
from contextlib import ExitStack

import httpx
import pytest

from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.servers import TIERS
from tests.gateway.gateway_setup import post_chat, running_gateway, small_and_thinker_toml, user

LOWEST_GROUP = '[routing]\nmode = "cascade"\n[routing.confidence]\nsource = "lowest_group"\ngroup_tokens = 4\n'
UNSURE_ON_TIER_0 = "[fake@fake-0 logprob=-3] What is 2 + 2?"  # exp(-3) = 0.05; the default -0.05 is 0.95


def test_an_unsure_answer_escalates_and_a_sure_one_is_accepted_without_logprobs_shown() -> None:
    with running_gateway(FakeScript(tokens=8), extra=LOWEST_GROUP) as (base, _, engine):
        unsure = post_chat(base, {"model": "cascade:balanced", "messages": user(UNSURE_ON_TIER_0)}).json()
        assert unsure["model"] == TIERS[1] and unsure["cascade"]["escalations"] == 1
        assert unsure["cascade"]["confidence"] == pytest.approx(0.9512, abs=1e-4)
        assert "logprobs" not in unsure["choices"][0] or unsure["choices"][0]["logprobs"] is None
        sure = post_chat(base, {"model": "cascade:balanced", "messages": user("What is 2 + 2?")}).json()
        assert sure["model"] == TIERS[0] and sure["cascade"]["confidence"] == pytest.approx(0.9512, abs=1e-4)
        with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=10, json={
                "model": "cascade:balanced", "messages": user(UNSURE_ON_TIER_0), "stream": True}) as r:
            frames = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert frames[0]["model"] == TIERS[1]
        assert not any(c.get("logprobs") for f in frames for c in f.get("choices", []))
        assert engine.stats.requests == 5
        # Logprobs are asked for below the top tier only: it always accepts, and they cost llama.cpp 8x.
        assert engine.stats.logprobs_requests == 5
        best = post_chat(base, {"model": "cascade:best", "messages": user(UNSURE_ON_TIER_0)}).json()
        assert best["model"] == TIERS[2] and engine.stats.logprobs_requests == 5


def test_a_client_that_asks_for_logprobs_gets_them_and_they_are_read_too() -> None:
    with running_gateway(FakeScript(tokens=8), extra=LOWEST_GROUP) as (base, _, _):
        body = post_chat(base, {"model": "cascade:balanced", "messages": user(UNSURE_ON_TIER_0),
                                "logprobs": True}).json()
    assert body["model"] == TIERS[1] and len(body["choices"][0]["logprobs"]["content"]) == 8


def test_calibration_maps_the_raw_confidence_before_the_threshold() -> None:
    # 0.95 raw -> sigmoid(logit(0.95) - 5) = 0.13 on tier-small: below balanced's 0.5, so it escalates.
    calibrated = LOWEST_GROUP + 'calibration = { "tier-small" = [1.0, -5.0] }\n'
    with running_gateway(FakeScript(tokens=8), extra=calibrated) as (base, _, _):
        body = post_chat(base, {"model": "cascade:balanced", "messages": user("What is 2 + 2?")}).json()
    assert body["model"] == TIERS[1] and body["cascade"]["confidence"] == pytest.approx(0.9512, abs=1e-4)


def test_a_tier_whose_engine_returns_no_logprobs_keeps_the_prior() -> None:
    engine = FakeEngine(FakeScript(tokens=8))
    with ExitStack() as stack:
        url = stack.enter_context(serve_asgi(engine))
        toml = LOWEST_GROUP + "".join(f"""
[[tiers]]
name = "{name}"
default_max_tokens = 32
backends = [{{ kind = "openai", url = "{url}", model = "fake-{i}", unsupported_params = ["logprobs"] }}]
""" for i, name in enumerate(TIERS[:2]))
        base = stack.enter_context(serve_asgi(Gateway(decode_config(toml)).app, lifespan="on"))
        body = post_chat(base, {"model": "cascade:balanced", "messages": user(UNSURE_ON_TIER_0)}).json()
    # Without a learned router the prior is 1: accepted where it was answered, the logprob directive unseen.
    assert body["model"] == TIERS[0] and body["cascade"]["confidence"] == 1.0


def test_a_reasoning_tier_prunes_an_unsure_branch_without_a_scorer() -> None:
    engine = FakeEngine(FakeScript(tokens=8))
    with ExitStack() as stack:
        url = stack.enter_context(serve_asgi(engine))
        toml = small_and_thinker_toml(url).replace(
            "branches = { n = 3, m = 2 }",
            'branches = { n = 3, m = 2, prune_confidence = 0.5, confidence_group = 4 }\nscorer = "none"')
        base = stack.enter_context(serve_asgi(Gateway(decode_config(toml)).app, lifespan="on"))
        prompt = "[fake answer=So_the_answer_is_18.|####_18 itl_ms=10] [fake@seed=1 logprob=-3] Q"
        body = post_chat(base, {"model": "thinker", "seed": 0, "messages": user(prompt)}).json()
        metrics = httpx.get(f"{base}/metrics", timeout=5).text
    branches = body["cascade"]["branches"]
    assert branches["pruned_confidence"] == 1 and branches["pruned"] == 1 and branches["finished"] == 2
    assert body["choices"][0]["message"]["content"].endswith("18") and body["choices"][0].get("logprobs") is None
    assert 'cascade_branches_total{event="pruned_confidence",tier="thinker"} 1.0' in metrics


def test_a_deepconf_tier_asks_for_top_k_candidates_and_stops_a_later_branch_less_sure_than_its_first_wave() -> None:
    engine = FakeEngine(FakeScript(tokens=8))
    with ExitStack() as stack:
        url = stack.enter_context(serve_asgi(engine))
        toml = small_and_thinker_toml(url).replace(
            "branches = { n = 3, m = 2 }",
            "branches = { n = 4, m = 4, first_wave = 2, confidence_keep = 0.9, confidence_group = 4, "
            'confidence_top_k = 5, aggregation = "confidence" }\nscorer = "none"')
        base = stack.enter_context(serve_asgi(Gateway(decode_config(toml)).app, lifespan="on"))
        prompt = ("[fake answer=So_the_answer_is_18.|####_18 itl_ms=10] "
                  "[fake@seed=1 answer=So_the_answer_is_17.|####_17] [fake@seed=3 logprob=-3] Q")
        body = post_chat(base, {"model": "thinker", "seed": 0, "messages": user(prompt)}).json()
    branches = body["cascade"]["branches"]
    assert branches["pruned_confidence"] == 1 and branches["finished"] == 3, branches
    assert body["choices"][0]["message"]["content"].endswith("18") and body["choices"][0].get("logprobs") is None
    assert engine.stats.logprobs_requests == 4  # every branch asked; the client asked for none and got none
