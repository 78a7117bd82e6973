"""/ready answers from the engines' background health checks (cascade/service/readiness.py): fast whatever the
engines do, 200 while some tier can serve (naming the others), 503 only when none can; a tier whose engine
stalled fails at once (or falls back in route mode) instead of waiting out its timeout; /health is liveness only.

A stalled engine is a FakeEngine with `stalled = True`: it accepts connections and never answers, /health
included. Every server binds 127.0.0.1 and stops when its block exits.
"""

from __future__ import annotations

import time
from timeit import repeat

import httpx

from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.waiting import eventually
from tests.gateway.gateway_setup import post_chat, user
from tests.gateway.test_failover import gateway, ladder, metric, servers

# Probes every 0.1 s, each cut at 0.3 s, one failure marks an engine down: well inside the tests' waits. The
# backends' read timeout (30 s) is what a request to a stalled engine would wait without them.
HEALTH = "[gateway.health]\ninterval_s = 0.1\ntimeout_s = 0.3\nunhealthy_after = 1\n"
HARD = "a long and hard question " * 30  # routed to the top tier by cascade:best (as in test_failover.py)


def ready(base: str) -> httpx.Response:
    """GET /ready with a client timeout far below any engine's: it must answer from local state."""
    return httpx.get(f"{base}/ready", timeout=0.5)


def test_a_stalled_tier_leaves_the_gateway_ready_and_its_requests_fail_fast_or_fall_back() -> None:
    hung = FakeEngine(FakeScript(tokens=4), stalled=True)
    with servers(FakeEngine(FakeScript(tokens=4)), hung) as [good, stalled], \
            gateway(ladder({"small": [good], "large": [stalled]}, HEALTH, read_s=30)) as (base, _):
        first = ready(base)  # the stalled engine's first probe may still be waiting
        assert eventually(lambda: ready(base).json()["status"] == "degraded", 5)
        report = ready(base)
        start = time.monotonic()
        named = post_chat(base, {"model": "large", "messages": user()})
        named_s = time.monotonic() - start
        routed = post_chat(base, {"model": "cascade:best", "messages": user(HARD)})
        served = post_chat(base, {"model": "small", "messages": user()})
        health = httpx.get(f"{base}/health", timeout=0.5)
        health_state = metric(base, 'cascade_replica_health_state{replica="large/0",tier="large"}')
    assert first.status_code == 200 and first.json()["status"] in ("ready", "degraded")
    body = report.json()
    assert report.status_code == 200 and body["tiers"] == {"small": True, "large": False}
    assert body["unhealthy"] == {"tiers": ["large"], "replicas": ["large/0"]}
    replica = body["replicas"]["large"]["large/0"]
    assert replica["health"] == "down" and "within 0.3 s" in replica["health_error"]
    assert body["replicas"]["small"]["small/0"]["health"] == "up"
    # The client named the stalled tier: a 503 error object at once, not a wait for its 30 s read timeout.
    assert named.status_code == 503 and named_s < 2.0
    assert set(named.json()["error"]) == {"message", "type", "param", "code"}
    assert "health checks" in named.json()["error"]["message"]
    assert routed.status_code == 200 and routed.json()["cascade"]["fallback_from"] == "large"
    assert served.status_code == 200 and health.json() == {"status": "ok"}
    assert health_state == 2


def test_with_every_tier_down_ready_is_503_until_an_engine_recovers_and_health_stays_200() -> None:
    engine = FakeEngine(FakeScript(tokens=4), stalled=True)
    with servers(engine) as [url], gateway(ladder({"small": [url], "large": [url]}, HEALTH)) as (base, gw):
        assert eventually(lambda: ready(base).status_code == 503, 5)
        down = ready(base)
        health = httpx.get(f"{base}/health", timeout=0.5)
        engine.stalled = False
        assert eventually(lambda: ready(base).status_code == 200, 5)
        back = ready(base)
        answered = post_chat(base, {"model": "large", "messages": user()})
        pollers = len(gw.readiness.monitor.pollers)
        # What /ready computes: local state only. The best of five batches: a busy CPU (make test's two workers)
        # only adds time, and the code's own cost is what is bounded.
        report_s = min(repeat(gw.readiness.report, number=200, repeat=5)) / 200
    assert down.json()["status"] == "unavailable" and down.json()["unhealthy"]["tiers"] == ["small", "large"]
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert back.json()["status"] == "ready" and back.json()["unhealthy"] == {"tiers": [], "replicas": []}
    assert answered.status_code == 200
    assert pollers == 1  # two tiers on one engine: one probe loop
    assert report_s < 0.5e-3
