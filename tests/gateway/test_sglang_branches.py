"""Branched tiers on SGLang behind the gateway, over real HTTP against the fake SGLang server (issue 30).

The fake enforces SGLang's rid rules (a rid already in flight gets a 400; an abort reaches every rid that
starts with the one given), so these tests fail if one client request's upstream rids repeat or prefix
each other, or if one branch's error hangs or fails the whole request.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx

from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeScript
from cascade.testing.fakes.sglang import FakeSGLang
from cascade.testing.waiting import eventually
from tests.gateway.gateway_setup import post_chat, user

RIGHT = "3_*_6_=_18.|So_the_answer_is_18.|####_18"
HANG_BOUND_S = 20  # the client's timeout: a request that hangs fails the test instead of the suite


def config(url: str, branches: int) -> str:
    return f"""
[[tiers]]
name = "thinker"
default_max_tokens = 400
branches = {{ n = {branches}, m = {branches} }}
scorer = "none"
backends = [{{ kind = "sglang", url = "{url}", model = "fake-1" }}]
"""


@contextmanager
def gateway(branches: int) -> Iterator[tuple[str, FakeSGLang, str]]:
    """Yield (gateway URL, the fake, its URL)."""
    # 20 ms between tokens: every branch of the request is in flight at once, as on a busy engine.
    engine = FakeSGLang(FakeScript(itl_ms=20, tokens=8), disconnect_abort_s=30)
    with serve_asgi(engine) as engine_url:
        gw = Gateway(decode_config(config(engine_url, branches)))
        with serve_asgi(gw.app, lifespan="on") as base:
            yield base, engine, engine_url


def ask(base: str, directives: str, **body: object) -> httpx.Response:
    return post_chat(base, {"model": "thinker", "messages": user(f"Q {directives}"), "seed": 0, **body},
                     timeout=HANG_BOUND_S)


def test_n_2_on_a_twelve_branch_tier_sends_24_distinct_rids_and_returns_two_choices() -> None:
    with gateway(12) as (base, engine, _):
        response = ask(base, f"[fake answer={RIGHT}]", n=2)
        body = response.json()
        assert response.status_code == 200, body
        assert [c["index"] for c in body["choices"]] == [0, 1]
        assert all(c["message"]["content"].endswith("#### 18") for c in body["choices"])
        branches = body["cascade"]["branches"]
        assert (branches["launched"], branches["finished"], branches["failed"]) == (24, 24, 0)
        # Every upstream request was accepted: no rid was refused as a duplicate, none aborted as a prefix.
        assert (engine.stats.requests, engine.stats.streams_started) == (24, 24)
        assert engine.stats.aborted == {}


def test_a_branch_refused_with_400_mid_request_ends_only_that_branch() -> None:
    with gateway(3) as (base, engine, _):
        response = ask(base, f"[fake answer={RIGHT}] [fake@seed=1 status=400]")
        body = response.json()
        assert response.status_code == 200, body
        branches = body["cascade"]["branches"]
        assert (branches["launched"], branches["finished"], branches["failed"]) == (3, 2, 1)
        assert branches["votes"] == {"18": 2}
        assert eventually(lambda: engine.stats.in_flight == 0)


def test_a_request_whose_every_branch_is_refused_gets_the_error_instead_of_hanging() -> None:
    with gateway(3) as (base, _, _):
        response = ask(base, "[fake status=400]")
        assert response.status_code == 400
        assert "scripted failure 400" in response.json()["error"]["message"]


def test_a_choice_aborted_upstream_is_reported_failed_not_finished() -> None:
    with gateway(1) as (base, engine, engine_url), ThreadPoolExecutor(1) as pool:
        # One branch per choice: choice 0 (seed 0) answers at once, choice 1 (seed 1) streams for seconds.
        pending = pool.submit(ask, base, "[fake tokens=2] [fake@seed=1 tokens=500]", n=2)
        assert eventually(lambda: engine.stats.streams_finished == 1 and engine.stats.in_flight == 1, 10)
        httpx.post(f"{engine_url}/abort_request", json={"abort_all": True}, timeout=5)
        body = pending.result(timeout=HANG_BOUND_S).json()
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "abort"]
    branches = body["cascade"]["branches"]
    assert (branches["launched"], branches["finished"], branches["failed"]) == (2, 1, 1)
