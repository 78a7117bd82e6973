"""Cascade mode over real HTTP: answer on the cheapest tier that can accept, escalate otherwise.

The fake engine plays every tier (models fake-0, fake-1, fake-2); `[fake@fake-0 ...]` directives
script one tier's behaviour, e.g. an answer cut off by max_tokens (default_max_tokens is 32).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeScript
from cascade.testing.servers import TIERS, ladder_toml
from tests.gateway.gateway_setup import post_chat, running_gateway, user

CASCADE = '[routing]\nmode = "cascade"\n'
CUT_OFF_ON_TIER_0 = "[fake@fake-0 tokens=100] What is 2 + 2?"


def escalations_metric(base: str, tier: str) -> float:
    for line in httpx.get(f"{base}/metrics", timeout=5).text.splitlines():
        if line.startswith(f'cascade_escalations_total{{tier="{tier}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_a_cut_off_answer_escalates_to_the_next_tier() -> None:
    with running_gateway(extra=CASCADE) as (base, _, engine):
        response = post_chat(base, {"model": "cascade:balanced", "messages": user(CUT_OFF_ON_TIER_0)})
        body = response.json()
        assert response.status_code == 200, body
        assert body["model"] == TIERS[1] and response.headers["x-cascade-tier"] == TIERS[1]
        assert body["cascade"]["escalations"] == 1 and body["cascade"]["confidence"] == 1.0
        assert body["choices"][0]["finish_reason"] == "stop"
        assert engine.stats.requests == 2 and escalations_metric(base, TIERS[0]) == 1.0


def test_a_complete_answer_is_accepted_on_the_cheapest_tier() -> None:
    with running_gateway(extra=CASCADE) as (base, _, engine):
        body = post_chat(base, {"model": "cascade:balanced", "messages": user("What is 2 + 2?")}).json()
        assert body["model"] == TIERS[0] and body["cascade"]["escalations"] == 0
        assert engine.stats.requests == 1


def test_a_failing_tier_escalates_and_a_failing_last_tier_is_a_502() -> None:
    with running_gateway(extra=CASCADE) as (base, _, _):
        body = post_chat(base, {"model": "cascade", "messages": user("[fake@fake-0 status=500] hi")}).json()
        assert body["model"] == TIERS[1] and body["cascade"]["escalations"] == 1
        everything_fails = "[fake status=500] [fake@fake-0 tokens=100] hi"
        response = post_chat(base, {"model": "cascade", "messages": user(everything_fails)})
        assert response.status_code == 502 and response.json()["error"]["type"] == "server_error"


def test_best_skips_tiers_that_can_never_accept_and_fast_accepts_anything() -> None:
    with running_gateway(extra=CASCADE) as (base, _, engine):
        body = post_chat(base, {"model": "cascade:best", "messages": user(CUT_OFF_ON_TIER_0)}).json()
        assert body["model"] == TIERS[2] and body["cascade"]["escalations"] == 0 and engine.stats.requests == 1
        body = post_chat(base, {"model": "cascade:fast", "messages": user(CUT_OFF_ON_TIER_0)}).json()
        assert body["model"] == TIERS[0] and body["choices"][0]["finish_reason"] == "length"


def test_configured_acceptance_thresholds_are_used() -> None:
    extra = CASCADE + "accept = { balanced = [1.01, 0.0] }\n"
    with running_gateway(extra=extra) as (base, _, engine):
        body = post_chat(base, {"model": "cascade:balanced", "messages": user("hi")}).json()
        assert body["model"] == TIERS[1] and engine.stats.requests == 1


def test_streamed_cascade_keeps_the_connection_alive_then_streams_the_accepted_answer() -> None:
    extra = '[gateway]\nkeepalive_s = 0.05\n' + CASCADE
    prompt = "[fake@fake-0 tokens=100 itl_ms=5] [fake@fake-1 ttft_ms=300] hi"
    with running_gateway(script=FakeScript(tokens=8), extra=extra) as (base, _, _):
        body = {"model": "cascade:balanced", "messages": user(prompt), "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=10) as response:
            assert response.status_code == 200 and response.headers["x-cascade-mode"] == "cascade"
            raw = b"".join(response.iter_bytes())
        events = [e for e in raw.split(b"\n\n") if e]
        assert events[0] == b": keep-alive" and events[-1] == b"data: [DONE]"
        chunks = [json.loads(e.removeprefix(b"data: ")) for e in events if e.startswith(b"data: {")]
        assert {c["model"] for c in chunks} == {TIERS[1]}
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == "".join(f"t{i} " for i in range(8))
        assert chunks[-1]["cascade"]["escalations"] == 1 and chunks[-1]["usage"]["completion_tokens"] == 8


def test_the_openai_sdk_reads_a_streamed_cascade() -> None:
    extra = '[gateway]\nkeepalive_s = 0.05\n' + CASCADE
    with running_gateway(extra=extra) as (base, _, _):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        stream = client.chat.completions.create(model="cascade:balanced", messages=user(CUT_OFF_ON_TIER_0),
                                                stream=True)
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert "".join(pieces).startswith("t0 ")


def test_a_cascade_plan_switches_the_gateway_to_cascade_mode(tmp_path: Path) -> None:
    plan = {"tiers": list(TIERS), "routing": "cascade",
            "operating_points": [{"hint": "balanced", "thresholds": [0.5, 0.5]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    engine_script = FakeScript(tokens=8)
    from cascade.testing.fakes.engine import FakeEngine

    engine = FakeEngine(engine_script)
    with serve_asgi(engine) as engine_url:
        gateway = Gateway(decode_config(ladder_toml(engine_url)), plan_path=str(tmp_path / "plan.json"))
        with serve_asgi(gateway.app, lifespan="on") as base:
            body = post_chat(base, {"model": "cascade", "messages": user(CUT_OFF_ON_TIER_0)}).json()
            assert body["model"] == TIERS[1] and body["cascade"]["escalations"] == 1


@pytest.mark.parametrize("accept", ["[0.5]", "[-0.1, 0.5]", '["x", 1]'])
def test_bad_acceptance_thresholds_name_the_key(accept: str) -> None:
    from cascade.errors import ConfigError

    with pytest.raises(ConfigError, match="accept"):
        decode_config(ladder_toml("http://127.0.0.1:9", CASCADE + f"accept = {{ balanced = {accept} }}\n"))
