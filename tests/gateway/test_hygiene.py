"""Input the gateway must refuse cleanly or accept as OpenAI does, and what it must never echo or leak.

Over real HTTP on 127.0.0.1, in front of the fake engine.
"""

from __future__ import annotations

import base64

import httpx
import msgspec
import pytest

from cascade.config import decode_config
from cascade.gateway.app import create_app
from cascade.gateway.server import Gateway
from cascade.schemas import RouteDecision
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeScript
from cascade.testing.servers import TIERS
from tests.gateway.gateway_setup import post_chat, running_gateway, user
from tests.servers import Replay, Reply, dead_url

SSE_OK = (b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
          b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n')


@pytest.fixture(scope="module")
def gw():
    with running_gateway(FakeScript(tokens=4)) as urls:
        yield urls[0]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/route"])
def test_invalid_utf8_inside_a_json_string_is_a_400(gw, path) -> None:
    raw = b'{"model": "cascade", "messages": [{"role": "user", "content": "caf\xc3\x28 \xff"}]}'
    response = httpx.post(f"{gw}{path}", content=raw, headers={"content-type": "application/json"}, timeout=10)
    assert response.status_code == 400
    assert "UTF-8" in response.json()["error"]["message"]


def test_whole_number_floats_are_accepted_where_integers_are_expected_as_openai_does(gw) -> None:
    accepted = post_chat(gw, {"model": TIERS[0], "messages": user(), "n": 2.0, "seed": 7.0})
    optional = post_chat(gw, {"model": TIERS[0], "messages": user(), "max_tokens": 3.0})  # `int | null` fields
    assert optional.status_code == 200, optional.text
    fractional = post_chat(gw, {"model": TIERS[0], "messages": user(), "n": 1.5})
    assert accepted.status_code == 200 and len(accepted.json()["choices"]) == 2
    assert fractional.status_code == 400 and fractional.json()["error"]["param"] == "n"


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/ready", "/metrics", "/v1/route"])
def test_every_405_names_the_allowed_methods(gw, path) -> None:
    response = httpx.request("TRACE" if path != "/v1/route" else "GET", f"{gw}{path}", timeout=5)
    assert response.status_code == 405
    assert response.headers["allow"] and response.json()["error"]["type"] == "invalid_request_error"


def test_a_route_decision_with_an_unreachable_threshold_is_valid_json_with_null(gw) -> None:
    response = httpx.post(f"{gw}/v1/route", json={"model": "cascade:fast", "messages": user("Say hello.")}, timeout=5)
    decision = msgspec.json.decode(response.content, type=RouteDecision)
    assert decision.thresholds is not None and None in decision.thresholds


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/route"])
def test_a_bad_quality_hint_is_a_400_even_when_a_tier_is_named(gw, path) -> None:
    body = {"model": TIERS[0], "messages": user()}
    by_header = httpx.post(f"{gw}{path}", json=body, headers={"X-Cascade-Quality": "AAA"}, timeout=5)
    by_body = httpx.post(f"{gw}{path}", json={**body, "quality": "AAA"}, timeout=5)
    assert (by_header.status_code, by_body.status_code) == (400, 400)
    assert by_header.json()["error"]["param"] == "X-Cascade-Quality"


def test_route_checks_branch_overrides_as_chat_does(gw) -> None:
    body = {"model": "cascade", "messages": user(), "branches": {"alpha": 2}}
    route = httpx.post(f"{gw}/v1/route", json=body, timeout=5)
    chat = post_chat(gw, body)
    assert route.status_code == chat.status_code == 400
    assert route.json()["error"]["param"] == chat.json()["error"]["param"] == "branches.alpha"


def test_errors_never_echo_megabytes_of_input(gw) -> None:
    long_model = post_chat(gw, {"model": "m" * 900_000, "messages": user()}, timeout=30)
    long_field = post_chat(gw, {"model": "cascade", "messages": user(), "f" * 500_000: 1}, timeout=30)
    long_hint = post_chat(gw, {"model": "cascade", "messages": user()}, {"X-Cascade-Quality": "q" * 60_000})
    assert (long_model.status_code, long_field.status_code, long_hint.status_code) == (404, 400, 400)
    for response in (long_model, long_field, long_hint):
        assert len(response.content) < 2_000


def test_a_probe_that_raises_makes_ready_a_503_with_the_reason() -> None:
    async def broken_probe() -> dict:
        raise RuntimeError("probe exploded")

    engine = Replay({})
    with serve_asgi(engine) as url:
        gateway = Gateway(decode_config(f'[[tiers]]\nname = "t"\nbackends = [{{ kind = "openai", url = "{url}", '
                                        'model = "m" }]\n'))
        app = create_app(gateway.service, ready_check=broken_probe)
        with serve_asgi(app) as base:
            response = httpx.get(f"{base}/ready", timeout=5)
    assert response.status_code == 503
    assert response.json()["status"] == "unavailable" and "probe exploded" in response.json()["error"]


def test_backend_credentials_in_the_url_are_sent_as_basic_auth_and_never_shown() -> None:
    replay = Replay({("POST", "/v1/chat/completions"): Reply(body=SSE_OK, content_type="text/event-stream"),
                     ("GET", "/health"): Reply(body=b"{}")})
    with serve_asgi(replay) as url:
        live = url.replace("http://", "http://alice:s3cret-pw@")
        dead = dead_url().replace("http://", "http://alice:s3cret-pw@")
        toml = "".join(f'[[tiers]]\nname = "{name}"\nbackends = [{{ kind = "openai", url = "{u}", model = "m", '
                       'timeouts = { connect_s = 1.0 } }]\n' for name, u in (("live", live), ("dead", dead)))
        gateway = Gateway(decode_config(toml))
        with serve_asgi(gateway.app, lifespan="on") as base:
            served = post_chat(base, {"model": "live", "messages": user()})
            failed = post_chat(base, {"model": "dead", "messages": user()})
            ready = httpx.get(f"{base}/ready", timeout=5)
    assert served.status_code == 200 and served.json()["choices"][0]["message"]["content"] == "hi"
    basic = "Basic " + base64.b64encode(b"alice:s3cret-pw").decode()
    assert {r.headers["authorization"] for r in replay.requests} == {basic}  # chats and health checks alike
    assert failed.status_code == 503
    for response in (failed, ready):
        assert "s3cret" not in response.text and "alice" not in response.text
