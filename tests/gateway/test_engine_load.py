"""The gateway reads its SGLang tiers' own load (real HTTP: the fake SGLang on 127.0.0.1 publishing SGLang's
metrics): load that another gateway put on the engine moves named hints off the tier and, past
`max_queue`, refuses it; an engine without metrics, or whose reading went stale, leaves the gateway's own counters
in charge; cascade's /metrics shows what was read."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx

from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.fakes.sglang import FakeSGLang
from cascade.testing.waiting import eventually
from tests.gateway.gateway_setup import post_chat, user
from tests.servers import open_streams

MEDIUM = "What is 2 + 2?"  # `balanced` routes it to tier-medium
LADDER = """
[routing.load]
enabled = true
{load}

[routing.engine_load]
poll_s = 0.05
stale_after = 4
{engine_load}

[[tiers]]
name = "tier-small"
backends = [{{ kind = "openai", url = "{plain}", model = "fake-0" }}]

[[tiers]]
name = "tier-medium"
backends = [{{ kind = "sglang", url = "{sglang}", model = "fake-1" }}]

[[tiers]]
name = "tier-large"
backends = [{{ kind = "openai", url = "{plain}", model = "fake-2" }}]
"""
QUEUE = 'cascade_engine_queue_requests{backend="tier-medium/0",tier="tier-medium"}'
FRESH = 'cascade_engine_load_fresh{backend="tier-medium/0",tier="tier-medium"}'


@contextmanager
def gateway(sglang: FakeSGLang, load: str = "", engine_load: str = "") -> Iterator[tuple[str, str]]:
    """Yield (gateway URL, the fake SGLang's URL): tier-medium on the fake SGLang, the others on a plain fake."""
    with ExitStack() as stack:
        plain = stack.enter_context(serve_asgi(FakeEngine(FakeScript(tokens=4))))
        engine = stack.enter_context(serve_asgi(sglang))
        config = decode_config(LADDER.format(load=load, engine_load=engine_load, plain=plain, sglang=engine))
        yield stack.enter_context(serve_asgi(Gateway(config).app, lifespan="on")), engine


def metric(base: str, series: str) -> float | None:
    for line in httpx.get(f"{base}/metrics", timeout=5).text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def routed_to(base: str, model: str = "cascade:balanced") -> str:
    decision = httpx.post(f"{base}/v1/route", json={"model": model, "messages": user(MEDIUM)}, timeout=5).json()
    return str(decision["tier_name"])


def test_a_tier_whose_engine_queues_another_gateways_load_is_full_here_until_its_reading_goes_stale() -> None:
    sglang = FakeSGLang(FakeScript(tokens=4, model="fake-1"), max_running=1, disconnect_abort_s=0.1)
    with gateway(sglang) as (base, url):
        assert eventually(lambda: metric(base, QUEUE) == 0.0)
        assert routed_to(base) == "tier-medium"
        with open_streams(url, 3, "[fake tokens=2000 itl_ms=10] hi"):
            assert eventually(lambda: metric(base, QUEUE) == 2.0, within_s=5)
            assert metric(base, 'cascade_engine_running_requests{backend="tier-medium/0",tier="tier-medium"}') == 1
            response = post_chat(base, {"model": "cascade:balanced", "messages": user(MEDIUM)})
            body = response.json()
            assert response.status_code == 200 and body["model"] == "tier-small"
            degraded = body["cascade"]["degraded"]
            assert (degraded["requested"], degraded["served"], degraded["tier"]) == ("balanced", "fast", "tier-medium")
            assert degraded["reason"] == "its engines queue 2 requests (1 running)"
            # Every request on the engine came from the other gateway.
            assert (sglang.scheduler.running, sglang.scheduler.queued) == (1, 2)
            # The engine stops publishing: once its reading is stale, this gateway's own counters decide again.
            sglang.scheduler.enabled = False
            assert eventually(lambda: metric(base, FRESH) == 0.0)
            assert metric(base, QUEUE) is None
            assert routed_to(base) == "tier-medium"
            failures = metric(base, 'cascade_engine_load_poll_failures_total{backend="tier-medium/0",'
                                    'tier="tier-medium"}')
            assert failures is not None and failures >= 1


def test_max_queue_refuses_a_tier_whose_engines_queue_that_many() -> None:
    sglang = FakeSGLang(FakeScript(tokens=4, model="fake-1"), max_running=1, disconnect_abort_s=0.1)
    with gateway(sglang, engine_load="max_queue = 2") as (base, url), open_streams(url, 3, "[fake tokens=2000 itl_ms=10] hi"):
        assert eventually(lambda: metric(base, QUEUE) == 2.0, within_s=5)
        refused = post_chat(base, {"model": "tier-medium", "messages": user("hi")})
        assert refused.status_code == 429
        assert "tier `tier-medium`'s engines have 2 requests waiting" in refused.json()["error"]["message"]
        assert post_chat(base, {"model": "tier-small", "messages": user("hi")}).status_code == 200


def test_an_engine_without_metrics_leaves_the_gateways_own_counters_in_charge() -> None:
    sglang = FakeSGLang(FakeScript(tokens=4, model="fake-1"))
    sglang.scheduler.enabled = False  # SGLang without --enable-metrics: /metrics is a 404
    with gateway(sglang, load="max_in_flight = { tier-medium = 1 }") as (base, _):
        assert eventually(lambda: (metric(base, 'cascade_engine_load_poll_failures_total{backend="tier-medium/0",'
                                               'tier="tier-medium"}') or 0) >= 2)
        assert metric(base, FRESH) == 0.0 and metric(base, QUEUE) is None
        assert routed_to(base) == "tier-medium"
        slow = threading.Thread(target=post_chat, args=(base, {"model": "tier-medium",
                                                               "messages": user("[fake ttft_ms=1500] hi")}))
        slow.start()
        try:
            assert eventually(lambda: sglang.stats.in_flight == 1)
            response = post_chat(base, {"model": "cascade:balanced", "messages": user(MEDIUM)})
            assert response.json()["model"] == "tier-small"
            assert response.json()["cascade"]["degraded"]["reason"] == "1 in flight of 1"
        finally:
            slow.join(timeout=10)
