"""Engine health probed in the background (cascade/branches/health_poller.py) and how a replica pool reads it
(cascade/branches/pool.py): one poller per engine URL, verdicts with thresholds, a stalled probe cut at its
timeout, failures counted and never raised; a replica seen down gets no requests, a tier with none up fails at
once, and a passing health check ends a bench for a refused connection."""

from __future__ import annotations

import asyncio
import time

import pytest

from cascade.branches.backend import GenerationRequest
from cascade.branches.fakes import FakeBackend
from cascade.branches.health_poller import HealthMonitor, HealthPoller
from cascade.branches.openai_client import OpenAIBackend
from cascade.branches.pool import ReplicaPool
from cascade.branches.sglang_client import SGLangBackend
from cascade.config import FailoverConfig, HealthConfig, Timeouts
from cascade.errors import BackendUnavailable
from cascade.schemas import ChatMessage
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript

REQUEST = GenerationRequest(messages=[ChatMessage(role="user", content="hi")], max_tokens=4)


class ScriptedProbe:
    """A health check answering the given results in turn (the last one from then on)."""

    def __init__(self, *results: bool) -> None:
        self.results = list(results)
        self.calls = 0

    async def __call__(self) -> bool:
        self.calls += 1
        return self.results[min(self.calls, len(self.results)) - 1]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def verdicts(poller: HealthPoller, n: int) -> list[str]:
    """The poller's state after each of `n` probes."""

    async def main() -> list[str]:
        states = []
        for _ in range(n):
            await poller.poll()
            states.append(poller.state())
        return states

    return asyncio.run(main())


def test_one_poller_per_engine_url_however_many_replicas_and_tiers_share_it() -> None:
    monitor = HealthMonitor(HealthConfig())
    first = monitor.watch(OpenAIBackend("small/0", "http://127.0.0.1:30000/", "a"))
    assert monitor.watch(SGLangBackend("large/0", "http://127.0.0.1:30000", "b")) is first  # another tier, same engine
    assert monitor.watch(OpenAIBackend("small/1", "http://user:pw@127.0.0.1:30000", "a")) is first
    other = monitor.watch(OpenAIBackend("small/2", "http://127.0.0.1:30001", "a"))
    in_process = monitor.watch(FakeBackend("fake/0"))
    assert len({id(first), id(other), id(in_process)}) == 3 and len(monitor.pollers) == 3
    assert first.url == "http://127.0.0.1:30000"  # what logs name: no credentials


def test_an_engine_goes_down_after_unhealthy_after_failures_and_up_after_healthy_after_passes() -> None:
    probe = ScriptedProbe(True, True, False, False, True, True)
    poller = HealthPoller("engine", probe, HealthConfig(unhealthy_after=2, healthy_after=2))
    assert poller.state() == "unknown" and not poller.down()  # no verdict yet: counts as serving
    assert verdicts(poller, 6) == ["unknown", "up", "up", "down", "down", "up"]
    assert (poller.passes, poller.failures, poller.error) == (4, 2, "")


def test_a_failed_probe_says_why_and_a_probe_that_raises_is_counted_not_raised() -> None:
    async def broken() -> bool:
        raise RuntimeError("probe bug")

    failing = HealthPoller("a", ScriptedProbe(False), HealthConfig(unhealthy_after=1))
    raising = HealthPoller("b", broken, HealthConfig(unhealthy_after=1))
    assert verdicts(failing, 1) == ["down"] and failing.error == "the health check failed"
    assert verdicts(raising, 2) == ["down", "down"]
    assert raising.failures == 2 and raising.error == "RuntimeError: probe bug"


def test_a_stalled_engines_probe_times_out_and_marks_it_down() -> None:
    engine = FakeEngine(FakeScript(tokens=4), stalled=True)  # accepts, never answers, /health included

    async def main(url: str) -> tuple[bool, float, HealthPoller]:
        backend = OpenAIBackend("hung/0", url, "m", Timeouts(connect_s=30.0))  # its own limit is far away
        poller = HealthPoller(url, backend.health, HealthConfig(timeout_s=0.3, unhealthy_after=1))
        try:
            start = time.monotonic()
            ok = await poller.poll()
            return ok, time.monotonic() - start, poller
        finally:
            await backend.aclose()

    with serve_asgi(engine) as url:
        ok, took_s, poller = asyncio.run(main(url))
    assert not ok and poller.down() and took_s < 2.0
    assert poller.error == "no answer to the health check within 0.3 s"


def test_a_verdict_goes_stale_once_nobody_probes() -> None:
    clock = Clock()
    config = HealthConfig(interval_s=1.0, timeout_s=1.0, unhealthy_after=1)
    poller = HealthPoller("engine", ScriptedProbe(False), config, clock)
    assert verdicts(poller, 1) == ["down"]
    clock.now += 2 * (config.interval_s + config.timeout_s) + 0.1  # the monitor stopped
    assert poller.state() == "unknown" and not poller.down()


def test_the_monitor_probes_each_engine_in_the_background_until_closed() -> None:
    up, gone = FakeBackend("up/0"), FakeBackend("gone/0", up=False)

    async def main() -> tuple[list[str], int, int]:
        monitor = HealthMonitor(HealthConfig(interval_s=0.05, unhealthy_after=1))
        pollers = [monitor.watch(up), monitor.watch(gone)]
        await monitor.start()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if all(p.state() != "unknown" for p in pollers):
                break
        await monitor.aclose()
        probes = sum(p.passes + p.failures for p in pollers)
        await asyncio.sleep(0.15)
        return [p.state() for p in pollers], probes, sum(p.passes + p.failures for p in pollers)

    states, probes, later = asyncio.run(main())
    assert states == ["up", "down"]
    assert later == probes  # closed: no more probes


def test_a_disabled_monitor_probes_nothing() -> None:
    async def main() -> int:
        monitor = HealthMonitor(HealthConfig(enabled=False, interval_s=0.05))
        poller = monitor.watch(FakeBackend("a/0"))
        await monitor.start()
        await asyncio.sleep(0.1)
        await monitor.aclose()
        return poller.passes + poller.failures

    assert asyncio.run(main()) == 0


# --- the replica pool reads the verdicts --------------------------------------------------------------------


def pool_with_health(*replicas: FakeBackend, failover: FailoverConfig | None = None
                     ) -> tuple[ReplicaPool, list[HealthPoller]]:
    """A pool whose replicas each read a poller of their own (down after one failed probe)."""
    pool = ReplicaPool("tier", list(replicas), failover)
    pollers = [HealthPoller(r.name, r.health, HealthConfig(unhealthy_after=1)) for r in replicas]
    pool.watch_health(pollers)
    return pool, pollers


def test_a_replica_seen_down_gets_no_requests_while_another_is_up() -> None:
    hung, fine = FakeBackend("tier/0"), FakeBackend("tier/1")
    pool, pollers = pool_with_health(hung, fine)
    hung.up = False
    asyncio.run(pollers[0].poll())  # down: the pool passes it over without trying it
    hung.up = True  # as a stalled engine would: it would take the request and never answer

    async def main() -> list[int]:
        return [(await pool.generate(REQUEST)).retries for _ in range(4)]

    assert asyncio.run(main()) == [0] * 4
    assert (len(hung.requests), len(fine.requests)) == (0, 4)
    assert [s.health for s in pool.states()] == ["down", "unknown"] and pool.serving()


def test_a_tier_whose_engines_are_all_down_fails_at_once_with_backend_unavailable() -> None:
    replicas = FakeBackend("tier/0", up=False), FakeBackend("tier/1", up=False)
    pool, pollers = pool_with_health(*replicas)

    async def main() -> float:
        for poller in pollers:
            await poller.poll()
        for replica in replicas:
            replica.up = True  # still no request may reach them: their health checks said down
        with pytest.raises(BackendUnavailable) as info:
            await pool.generate(REQUEST)
        return info.value.retry_after_s or 0.0

    assert asyncio.run(main()) >= 1.0
    assert not pool.available() and not pool.serving()
    assert all(not r.requests for r in replicas)


def test_a_passing_health_check_ends_a_bench_for_a_refused_connection() -> None:
    engine = FakeBackend("tier/0", up=False)  # refuses: benched for 30 s at the first request
    pool, (poller,) = pool_with_health(engine, failover=FailoverConfig(breaker_open_s=30.0))

    async def main() -> tuple[str, str, str]:
        with pytest.raises(BackendUnavailable):
            await pool.generate(REQUEST)
        benched = pool.states()[0].state
        engine.up = True  # the engine restarted
        await poller.poll()
        after = pool.states()[0].state
        await pool.generate(REQUEST)  # the next request probes it, and closes the breaker
        return benched, after, pool.states()[0].state

    assert asyncio.run(main()) == ("open", "half_open", "closed")
