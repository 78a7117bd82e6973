"""A tier with reasoning branches behind the gateway, over real HTTP against the fake engine.

`[fake@seed=N ...]` scripts the branch with seed N: the request's seed is the first branch's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.waiting import eventually
from tests.gateway.gateway_setup import post_chat, user

RIGHT = "3_*_6_=_18.|So_the_answer_is_18.|####_18"
WRONG = "3_*_6_=_19.|So_the_answer_is_19.|####_19"
SLOW = "ttft_ms=0 itl_ms=40 tokens=300"


def config(url: str, tier: str = "", extra: str = "", n: int = 3, m: int = 2, branch: str = "") -> str:
    """`tier`: more keys of the `thinker` tier; `branch`: more of its [tiers.branches]."""
    return f"""{extra}
[[tiers]]
name = "plain"
default_max_tokens = 64
backends = [{{ kind = "openai", url = "{url}", model = "fake-0" }}]

[[tiers]]
name = "thinker"
default_max_tokens = 400
{tier}
backends = [{{ kind = "openai", url = "{url}", model = "fake-1" }}]

[tiers.branches]
n = {n}
m = {m}
{branch}
"""


@contextmanager
def served(tier: str = "", extra: str = "", n: int = 3, m: int = 2, branch: str = ""
           ) -> Iterator[tuple[str, FakeEngine, Gateway]]:
    """A gateway on `config(...)` in front of a fake engine: its URL, the engine and the gateway itself."""
    engine = FakeEngine(FakeScript(tokens=8))
    with serve_asgi(engine) as engine_url:
        gw = Gateway(decode_config(config(engine_url, tier, extra, n, m, branch)))
        with serve_asgi(gw.app, lifespan="on") as base:
            yield base, engine, gw


@contextmanager
def gateway(tier: str = "", extra: str = "", branch: str = "") -> Iterator[tuple[str, FakeEngine]]:
    with served(tier, extra, branch=branch) as (base, engine, _):
        yield base, engine


def ask(base: str, directives: str, **body: object) -> httpx.Response:
    return post_chat(base, {"model": "thinker", "messages": user(f"Q {directives}"), "seed": 0, **body}, timeout=20)


def test_branches_vote_early_stop_and_report_in_the_cascade_object() -> None:
    with gateway() as (base, engine):
        response = ask(base, f"[fake answer={RIGHT}] [fake@seed=1 answer={WRONG} ttft_ms=300] [fake@seed=2 {SLOW}]")
        body = response.json()
        assert response.status_code == 200, body
        branches = body["cascade"]["branches"]
        assert body["choices"][0]["message"]["content"].endswith("#### 18")
        assert (branches["configured"], branches["launched"], branches["finished"]) == (3, 3, 2)
        assert branches["early_stopped"] == 1 and branches["decode_tokens"] > 0
        assert branches["votes"] in ({"18": 1, "19": 1}, {"18": 2})
        assert eventually(lambda: engine.stats.in_flight == 0) and engine.stats.streams_cancelled >= 1
        metrics = httpx.get(f"{base}/metrics", timeout=5).text
        assert 'cascade_branches_total{event="early_stopped",tier="thinker"} 1.0' in metrics
        assert 'cascade_decode_tokens_total{tier="thinker"}' in metrics


def test_the_majority_answer_is_returned() -> None:
    with gateway() as (base, _):
        directives = f"[fake answer={WRONG}] [fake@seed=0 answer={RIGHT}] [fake@seed=2 answer={RIGHT}]"
        body = ask(base, directives, branches={"m": 3}).json()
        assert body["choices"][0]["message"]["content"].endswith("#### 18")
        assert body["cascade"]["branches"]["votes"] == {"18": 2, "19": 1}


def test_a_streamed_branched_request_keeps_alive_then_sends_the_voted_answer() -> None:
    with gateway(extra="[gateway]\nkeepalive_s = 0.05\n") as (base, _):
        body = {"model": "thinker", "messages": user(f"Q [fake answer={RIGHT} ttft_ms=300]"), "stream": True, "seed": 0}
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=20) as response:
            raw = b"".join(response.iter_bytes())
        events = [e for e in raw.split(b"\n\n") if e]
        assert events[0] == b": keep-alive" and events[-1] == b"data: [DONE]"
        chunks = [json.loads(e.removeprefix(b"data: ")) for e in events if e.startswith(b"data: {")]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text.endswith("#### 18") and chunks[-1]["cascade"]["branches"]["finished"] == 2


def test_a_request_may_override_branch_settings_within_limits() -> None:
    with gateway() as (base, engine):
        body = ask(base, f"[fake answer={RIGHT}]", branches={"n": 1}).json()
        assert body["cascade"]["branches"]["launched"] == 1 and engine.stats.requests == 1
        body = ask(base, f"[fake answer={RIGHT}]", branches={"n": 5, "m": 1}).json()
        assert body["cascade"]["branches"]["launched"] == 5 and body["cascade"]["branches"]["finished"] == 1


@pytest.mark.parametrize(("override", "param"), [
    ({"n": 100}, "branches.n"),
    ({"n": 2, "m": 3}, "branches.m"),
    ({"alpha": 1.5}, "branches.alpha"),
    ({"k": 0}, "branches.k"),
    ({"beta": -1}, "branches.beta"),
])
def test_bad_branch_overrides_get_a_400_naming_the_param(override: dict, param: str) -> None:
    with gateway() as (base, engine):
        response = ask(base, "", branches=override)
        assert response.status_code == 400 and response.json()["error"]["param"] == param
        assert engine.stats.requests == 0


def test_branch_slots_bound_live_branches_and_freed_slots_admit_waiting_requests() -> None:
    with gateway(branch="slots = 3") as (base, engine):
        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as client:
                body = {"model": "thinker", "messages": user(f"Q [fake answer={RIGHT} itl_ms=20]"), "seed": 0}
                return await asyncio.gather(*(client.post(f"{base}/v1/chat/completions", json=body) for _ in range(4)))

        responses = asyncio.run(burst())
        assert all(r.status_code == 200 for r in responses)
        assert engine.stats.peak_in_flight <= 3 and engine.stats.requests == 12


def test_a_request_that_cannot_get_slots_in_time_gets_a_429() -> None:
    extra = "[gateway.limits]\nmax_slot_wait_s = 0.2\n"
    with gateway(branch="slots = 3", extra=extra) as (base, _):
        async def two() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as client:
                slow = {"model": "thinker", "messages": user(f"Q [fake {SLOW}]"), "seed": 0, "max_tokens": 30}
                first = asyncio.create_task(client.post(f"{base}/v1/chat/completions", json=slow))
                await asyncio.sleep(0.2)
                second = await client.post(f"{base}/v1/chat/completions", json=slow)
                return [await first, second]

        first, second = asyncio.run(two())
        assert first.status_code == 200 and second.status_code == 429
        assert "branch slots" in second.json()["error"]["message"]


def test_a_config_with_fewer_slots_than_branches_is_refused() -> None:
    from cascade.errors import ConfigError

    with pytest.raises(ConfigError, match=r"tiers\[1\].branches.slots` \(2\) must be 0 \(no limit\) or at least n \(3\)"):
        decode_config(config("http://127.0.0.1:9", branch="slots = 2"))


@pytest.mark.parametrize(("model", "asked", "tier", "extra"), [
    ("thinker", {}, "max_in_flight = 1", ""),
    ("plain", {"branches": {"n": 3, "m": 2}}, "", "[gateway.limits]\nmax_in_flight_per_tier = 1\n"),
], ids=["tier_with_branches", "request_asking_for_branches"])
def test_a_stream_to_a_full_branched_tier_gets_a_429_with_retry_after_and_the_admitted_one_its_answer(
        model: str, asked: dict, tier: str, extra: str) -> None:
    extra = f"[gateway]\nkeepalive_s = 0.05\n{extra}"
    with gateway(tier=tier, extra=extra) as (base, engine):
        async def two() -> tuple[int, bytes, httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as client:
                body = {"model": model, "messages": user(f"Q [fake {SLOW}]"), "seed": 0, "max_tokens": 30,
                        "stream": True, **asked}

                async def admitted() -> tuple[int, bytes]:
                    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
                        return r.status_code, b"".join([chunk async for chunk in r.aiter_bytes()])

                first = asyncio.create_task(admitted())
                while engine.stats.in_flight == 0:  # the first holds the tier's one place, its branches running
                    await asyncio.sleep(0.01)
                refused = await client.post(f"{base}/v1/chat/completions", json=body)
                status, raw = await first
                return status, raw, refused

        status, raw, refused = asyncio.run(two())
        counted = httpx.get(f"{base}/metrics", timeout=5).text
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.headers["content-type"].startswith("application/json")
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and f"tier `{model}` is at its limit of 1" in error["message"]
    assert 'cascade_client_errors_total{status="429"} 1.0' in counted  # once
    events = [e for e in raw.split(b"\n\n") if e]
    assert status == 200 and events[0] == b": keep-alive" and events[-1] == b"data: [DONE]"
    answer = json.loads(events[-2].removeprefix(b"data: "))
    assert answer["model"] == model and answer["cascade"]["branches"]["launched"] == 3
    assert any(json.loads(e.removeprefix(b"data: "))["choices"][0]["delta"].get("content")
               for e in events if e.startswith(b"data: {"))


def test_a_streamed_request_that_cannot_get_slots_ends_with_an_in_band_error_not_a_dropped_connection() -> None:
    extra = "[gateway]\nkeepalive_s = 0.05\n[gateway.limits]\nmax_slot_wait_s = 0.3\n"
    with gateway(branch="slots = 3", extra=extra) as (base, _):
        async def two() -> tuple[httpx.Response, bytes]:
            async with httpx.AsyncClient(timeout=30) as client:
                slow = {"model": "thinker", "messages": user(f"Q [fake {SLOW}]"), "seed": 0, "max_tokens": 30}
                first = asyncio.create_task(client.post(f"{base}/v1/chat/completions", json=slow))
                await asyncio.sleep(0.2)
                async with client.stream("POST", f"{base}/v1/chat/completions", json={**slow, "stream": True}) as r:
                    raw = b"".join([chunk async for chunk in r.aiter_bytes()])
                return await first, raw

        first, raw = asyncio.run(two())
        assert first.status_code == 200
        events = [e for e in raw.split(b"\n\n") if e]
        error = json.loads(events[-2].removeprefix(b"data: "))["error"]
        assert error["type"] == "rate_limit_error" and "branch slots" in error["message"]
        assert events[-1] == b"data: [DONE]"


def test_a_first_wave_that_agrees_answers_alone_and_a_request_s_smaller_m_runs_every_branch() -> None:
    with served(branch="first_wave = 2\nslots = 5", n=5, m=5) as (base, engine, gw):
        agreed = ask(base, f"[fake answer={RIGHT}]").json()["cascade"]["branches"]
        assert (agreed["configured"], agreed["launched"], agreed["finished"]) == (5, 2, 2)
        assert engine.stats.requests == 2
        split = ask(base, f"[fake answer={RIGHT}] [fake@seed=1 answer={WRONG}]").json()["cascade"]["branches"]
        assert (split["launched"], split["finished"], split["votes"]) == (5, 5, {"18": 4, "19": 1})
        # A request's M of 2 leaves no room for a first wave below it: all five start, two finish.
        body = ask(base, f"[fake answer={RIGHT}]", branches={"m": 2}).json()["cascade"]["branches"]
        assert body["launched"] == 5 and body["finished"] == 2
        assert eventually(lambda: engine.stats.in_flight == 0)
        assert gw.service.tiers[1].slots.free == 5  # the slots the unstarted branches held came back


def test_a_tier_with_a_wave_margin_launches_doubling_waves_until_an_answer_leads_by_it() -> None:
    branch = "first_wave = 2\nwave_margin = 2\nslots = 8"
    with served(branch=branch, n=8, m=8) as (base, engine, gw):
        # Seed 1 dissents: 1-1 after two, 3-1 after four, so the last four never start.
        split = ask(base, f"[fake answer={RIGHT}] [fake@seed=1 answer={WRONG}]").json()["cascade"]["branches"]
        assert (split["launched"], split["finished"], split["votes"]) == (4, 4, {"18": 3, "19": 1})
        assert eventually(lambda: engine.stats.in_flight == 0)
        assert gw.service.tiers[1].slots.free == 8


def test_a_wave_margin_without_a_first_wave_is_refused() -> None:
    from cascade.errors import ConfigError

    with pytest.raises(ConfigError, match=r"tiers\[1\].branches.wave_margin` needs first_wave"):
        decode_config(config("http://127.0.0.1:9", branch="wave_margin = 2", n=8, m=8))


@pytest.mark.parametrize("first_wave", [1, 2])
def test_a_first_wave_below_two_or_not_below_m_is_refused(first_wave: int) -> None:
    from cascade.errors import ConfigError

    with pytest.raises(ConfigError, match=r"tiers\[1\].branches.first_wave` must be 0 \(off\) or from 2 to m - 1"):
        decode_config(config("http://127.0.0.1:9", branch=f"first_wave = {first_wave}"))
