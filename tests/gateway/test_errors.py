"""Bad input and backend faults: the right status, an OpenAI error object naming the param,
never a hang, never a traceback, and the process keeps serving."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from cascade.engines.supervisor import free_port
from cascade.testing.fakes.engine import FakeScript
from cascade.testing.servers import TIERS
from tests.gateway.gateway_setup import post_chat, running_gateway, user

LIMITS = "[gateway.limits]\nmax_body_bytes = 20000\nmax_n = 4\nmax_tokens = 1000\nmax_messages = 50\n"
# The module's gateway is shared by tests that each inject a fault: a breaker that benched the one replica
# after three of them would turn the next test's fault into a 503 (tests/gateway/test_failover.py tests it).
LIMITS += "[gateway.failover]\nbreaker_failures = 1000\n"


@pytest.fixture(scope="module")
def gw():
    with running_gateway(FakeScript(tokens=4), extra=LIMITS, read_s=0.5) as urls:
        yield urls


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "cascade", "messages": []}, "messages"),
    ({"model": "cascade"}, "messages"),
    ({"messages": user()}, "model"),
    ({"model": "cascade", "messages": user(), "n": 0}, "n"),
    ({"model": "cascade", "messages": user(), "n": 5}, "n"),
    ({"model": "cascade", "messages": user(), "n": "two"}, "n"),
    ({"model": "cascade", "messages": user(), "max_tokens": 10**9}, "max_tokens"),
    ({"model": "cascade", "messages": user(), "max_tokens": 0}, "max_tokens"),
    ({"model": "cascade", "messages": user(), "max_completion_tokens": -1}, "max_completion_tokens"),
    ({"model": "cascade", "messages": user(), "temperature": 3}, "temperature"),
    ({"model": "cascade", "messages": user(), "top_p": 0}, "top_p"),
    ({"model": "cascade", "messages": user(), "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": "cascade", "messages": user(), "quality": "fastest"}, "quality"),
    ({"model": "cascade", "messages": user(), "quality": 2}, "quality"),
    ({"model": "cascade:turbo", "messages": user()}, "model"),
    ({"model": "cascade", "messages": user(), "stream_options": {"include_usage": True}}, "stream_options"),
    ({"model": "cascade", "messages": user(), "frobnicate": 1}, "frobnicate"),
    ({"model": "cascade", "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"model": "cascade", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"model": "cascade", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0].type"),
    ({"model": "cascade", "messages": [{"role": "user", "content": "x"}] * 51}, "messages"),
])
def test_bad_request_gets_400_naming_the_param(gw, body, param) -> None:
    error = assert_error(post_chat(gw[0], body), 400, param)
    assert error["type"] == "invalid_request_error"


def test_bad_quality_header_names_the_header(gw) -> None:
    assert_error(post_chat(gw[0], {"model": "cascade", "messages": user()}, {"X-Cascade-Quality": "x"}), 400,
                 "X-Cascade-Quality")


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b"null", b'"text"', b"\xff\xfe"])
def test_malformed_body_gets_400(gw, raw) -> None:
    assert_error(post_chat(gw[0], raw), 400)


def test_unknown_model_gets_404_model_not_found(gw) -> None:
    error = assert_error(post_chat(gw[0], {"model": "gpt-17", "messages": user()}), 404, "model")
    assert error["code"] == "model_not_found" and "cascade:best" in error["message"]


def test_sdk_raises_typed_errors(gw) -> None:
    sdk = openai.OpenAI(base_url=f"{gw[0]}/v1", api_key="unused", max_retries=0)
    try:
        with pytest.raises(openai.NotFoundError):
            sdk.chat.completions.create(model="nope", messages=user())
        with pytest.raises(openai.BadRequestError) as info:
            sdk.chat.completions.create(model="cascade", messages=user(), n=99)
        assert info.value.param == "n"
    finally:
        sdk.close()


def test_oversized_body_gets_413_with_and_without_content_length(gw) -> None:
    big = {"model": "cascade", "messages": user("x" * 30000)}
    assert_error(post_chat(gw[0], big), 413)

    def chunks():
        yield json.dumps(big).encode()

    response = httpx.post(f"{gw[0]}/v1/chat/completions", content=chunks(), timeout=10)  # chunked, no length
    assert_error(response, 413)


def test_unknown_route_and_wrong_method_get_error_objects(gw) -> None:
    assert_error(httpx.get(f"{gw[0]}/v1/nothing"), 404)
    assert_error(httpx.get(f"{gw[0]}/v1/chat/completions"), 405)


def test_backend_500_becomes_502(gw) -> None:
    error = assert_error(post_chat(gw[0], {"model": TIERS[0], "messages": user("[fake status=500]")}), 502)
    assert error["type"] == "server_error" and TIERS[0] in error["message"]


def test_backend_500_on_stream_becomes_502_before_any_byte(gw) -> None:
    body = {"model": TIERS[0], "messages": user("[fake status=500]"), "stream": True}
    assert_error(post_chat(gw[0], body), 502)


def test_stalled_backend_becomes_504_not_a_hang(gw) -> None:
    start = time.monotonic()
    assert_error(post_chat(gw[0], {"model": TIERS[0], "messages": user("[fake stall_after=0]")}), 504)
    assert time.monotonic() - start < 5


def test_stream_that_stalls_midway_ends_with_an_error_event(gw) -> None:
    body = {"model": TIERS[0], "messages": user("[fake stall_after=2]"), "stream": True}
    with httpx.stream("POST", f"{gw[0]}/v1/chat/completions", json=body, timeout=10) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][6:])["error"]
    assert "timed out" in error["message"]


def test_backend_down_gives_503_with_retry_after_and_ready_says_which_tier() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with running_gateway(dead_url=dead) as (base, _, _):
        # Named by the client: no fallback to another tier.
        response = post_chat(base, {"model": TIERS[2], "messages": user()})
        error = assert_error(response, 503)
        ready = httpx.get(f"{base}/ready", timeout=10)
        still_serving = post_chat(base, {"model": "cascade:fast", "messages": user()})
    assert "unreachable" in error["message"]
    assert int(response.headers["retry-after"]) >= 1
    # The other tiers serve: the gateway stays ready ("degraded"), naming the tier and replica that cannot.
    assert ready.status_code == 200 and ready.json()["status"] == "degraded"
    assert ready.json()["tiers"][TIERS[2]] is False
    assert ready.json()["unhealthy"] == {"tiers": [TIERS[2]], "replicas": [f"{TIERS[2]}/0"]}
    assert ready.json()["replicas"][TIERS[2]][f"{TIERS[2]}/0"]["breaker"] == "open"
    assert still_serving.status_code == 200


def test_overload_gets_429() -> None:
    extra = "[gateway.limits]\nmax_in_flight = 1\n"
    with running_gateway(FakeScript(tokens=2, ttft_ms=1500), extra=extra) as (base, _, _), ThreadPoolExecutor(1) as pool:
        slow = pool.submit(post_chat, base, {"model": "cascade", "messages": user()})
        time.sleep(0.5)  # the slow request is now in flight, waiting for its first token
        assert_error(post_chat(base, {"model": "cascade", "messages": user()}), 429)
        assert slow.result().status_code == 200


def test_random_garbage_never_crashes_the_gateway(gw) -> None:
    rng = random.Random(0)
    values = [None, True, -1, 0, 2**63, 1e308, "", "x" * 100, [], {}, [{}], {"role": "user"}]
    fields = ["model", "messages", "n", "max_tokens", "stream", "stop", "quality", "temperature", "seed"]
    statuses = set()
    for _ in range(150):
        body = {f: rng.choice(values) for f in rng.sample(fields, rng.randint(0, len(fields)))}
        if rng.random() < 0.3:
            raw = json.dumps(body).encode()
            cut = rng.randint(0, len(raw))
            response = post_chat(gw[0], raw[:cut] + bytes(rng.randrange(256) for _ in range(3)))
        else:
            response = post_chat(gw[0], body)
        statuses.add(response.status_code)
        assert response.status_code < 500, response.text
        assert "error" in response.json()
    assert httpx.get(f"{gw[0]}/health").status_code == 200
    assert statuses <= {400, 404, 413}
