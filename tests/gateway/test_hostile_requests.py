"""What a hostile client's request does to a running gateway (real HTTP, the learned router, fake engines).

Each case broke a gateway once: 60,000 newlines froze the event loop for 36 s in the router's featurizer (nothing
else, /health included, was answered meanwhile); a tool schema 3,000 levels deep was a 500 with a traceback.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import httpx
import pytest

from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.router.router import Router, routed_text
from cascade.testing.asgi import serve_asgi
from cascade.testing.servers import ladder_toml
from tests.gateway.gateway_setup import post_chat, running_gateway, user

HOSTILE_PROMPTS = ["\n" * 60_000 + "a", " " * 60_000 + "a", "1" * 60_000, "1+" * 30_000, "A.\n" * 20_000,
                   "9" * 400 + " apples. How many?"]


def learned(router_dir: Path) -> str:
    return f'[routing]\npolicy = "learned"\nrouter = "{router_dir}"\n'


def test_hostile_prompts_are_routed_and_answered_while_health_keeps_answering(router_dir: Path) -> None:
    with running_gateway(extra=learned(router_dir)) as (base, _, _):
        health: list[int] = []
        done = threading.Event()

        def probe() -> None:
            with httpx.Client(timeout=5) as client:
                while not done.is_set():
                    health.append(client.get(f"{base}/health").status_code)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            for prompt in HOSTILE_PROMPTS:
                body = {"model": "cascade:balanced", "messages": user(prompt), "max_tokens": 4}
                # The bound is a hang detector, not a speed claim: before the fix the first prompt took 36 s.
                route = httpx.post(f"{base}/v1/route", json=body, timeout=10)
                assert route.status_code == 200 and route.json()["router"] in {"learned", "heuristic"}
                assert post_chat(base, body, timeout=10).status_code == 200
        finally:
            done.set()
            prober.join(timeout=10)
        assert health and set(health) == {200}


def test_a_body_nested_past_the_limit_is_a_400_naming_it_with_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    schema: str = '{"type":"string"}'
    for _ in range(3_000):
        schema = f'{{"type":"object","properties":{{"x":{schema}}}}}'
    body = (f'{{"model":"cascade","messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function",'
            f'"function":{{"name":"f","parameters":{schema}}}}}]}}').encode()
    with caplog.at_level(logging.ERROR), running_gateway() as (base, _, engine):
        for path in ("/v1/chat/completions", "/v1/route"):
            response = httpx.post(f"{base}{path}", content=body, headers={"content-type": "application/json"},
                                  timeout=10)
            error = response.json()["error"]
            assert response.status_code == 400 and error["code"] == "nesting_too_deep"
            assert "the limit is 64" in error["message"]
        assert engine.stats.requests == 0
    assert not [r for r in caplog.records if r.exc_info], "a refused body must not log a traceback"


def test_the_nesting_limit_is_configurable_and_bounded() -> None:
    config = decode_config(ladder_toml("http://127.0.0.1:9", "[gateway.limits]\nmax_json_depth = 16\n"))
    assert config.gateway.limits.max_json_depth == 16
    assert decode_config(ladder_toml("http://127.0.0.1:9")).gateway.limits.max_json_depth == 64
    for bad in (4, 10_000):
        with pytest.raises(Exception, match="max_json_depth"):
            decode_config(ladder_toml("http://127.0.0.1:9", f"[gateway.limits]\nmax_json_depth = {bad}\n"))


def test_the_router_reads_the_first_and_last_halves_of_a_long_prompt(router_dir: Path) -> None:
    config = decode_config(ladder_toml("http://127.0.0.1:9", learned(router_dir) + "max_prompt_chars = 1024\n"))
    assert config.routing.max_prompt_chars == 1024
    head, tail = "Sam buys 3 apples for $2 each. " * 10, " How much does he pay in total?"
    prompt = head + "x " * 50_000 + tail
    routed = routed_text(prompt, 1024)
    assert len(routed) <= 1024 and routed.startswith(head[:300]) and routed.endswith(tail)
    assert routed_text("short", 1024) == "short"
    from cascade.router.load import TierShape
    from cascade.router.signals import routing_signal

    shapes = [TierShape(t.name, t.branches.slots, t.branches.n) for t in config.tiers]
    router = Router(shapes, config.routing, routing_signal(config.routing, [t.name for t in config.tiers]))
    assert router.assess(prompt) == router.assess(routed)
    for bad in (100, 2_000_000):
        with pytest.raises(Exception, match="max_prompt_chars"):
            decode_config(ladder_toml("http://127.0.0.1:9", f"[routing]\nmax_prompt_chars = {bad}\n"))


def test_whole_float_counts_are_served_and_fractions_refused_by_name() -> None:
    with running_gateway() as (base, _, _):
        ok = post_chat(base, {"model": "cascade:fast", "messages": user(), "n": 2.0, "max_tokens": 4.0})
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 2
        bad = post_chat(base, json.dumps({"model": "cascade:fast", "messages": user(), "n": 2.0,
                                          "max_tokens": 4.5}).encode())
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"


def test_long_prompts_are_routed_in_the_routers_child_as_in_a_thread(router_dir: Path) -> None:
    prompts = ["1+" * 3000, "\u00a0\u0663" * 2000, "Sam buys 3 apples for $2 each. " * 80 + "How much?"]
    routes: dict[str, list[dict]] = {}
    for where in ("process", "thread"):
        config = decode_config(ladder_toml("http://127.0.0.1:9", learned(router_dir) +
                                           f'assess_long_prompts = "{where}"\n'))
        assert config.routing.assess_long_prompts == where
        gateway = Gateway(config)
        with serve_asgi(gateway.app, lifespan="on") as base:
            deadline = time.monotonic() + 120  # the child's start on a loaded 2-core machine (~2 s idle)
            while where == "process" and gateway.service.assessor.child_calls == 0:
                assert time.monotonic() < deadline, "the router's child never answered"
                httpx.post(f"{base}/v1/route", json={"model": "cascade", "messages": user(prompts[0])}, timeout=30)
                time.sleep(0.2)
            routes[where] = [httpx.post(f"{base}/v1/route", json={"model": "cascade", "messages": user(p)},
                                        timeout=30).json() for p in prompts]
        assessor = gateway.service.assessor
        if where == "process":
            assert assessor is not None and assessor.child_calls >= len(prompts) + 1
            assert assessor._pool is None  # the gateway's shutdown stopped its child
        else:
            assert assessor is None
    assert routes["process"] == routes["thread"]
    with pytest.raises(Exception, match="assess_long_prompts"):
        decode_config(ladder_toml("http://127.0.0.1:9", '[routing]\nassess_long_prompts = "gpu"\n'))
