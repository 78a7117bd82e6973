"""Probing engines' health in the background: one poller per engine URL, shared by every replica on that engine.

A `HealthPoller` runs one engine's health check (the `health()` of the first Backend that watches it: GET /health;
SGLang's runs a one-token generation and has its own long timeout) every `interval_s`, each probe cut at
`timeout_s`, and keeps a verdict: down after `unhealthy_after` failed probes in a row, up after `healthy_after`
passes in a row, unknown (None) until then. Unknown counts as serving, so that a gateway whose engines are up is not
held out of rotation for the length of a first SGLang probe (up to 20 s), while an engine that is down is found by
the first request to it (a refused connection benches the replica, cascade/branches/pool.py) or by the next probes.
Failures are counted, never raised. `HealthMonitor` owns the pollers and their tasks; the gateway starts and closes
it with its own lifecycle, and everyone who needs health (`/ready`, replica picking) reads the pollers' state,
which is local and costs no request anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

from cascade.branches.backend import Backend
from cascade.branches.openai_client import OpenAIBackend
from cascade.config import HealthConfig

log = logging.getLogger("cascade.health")

Probe = Callable[[], Awaitable[bool]]
HealthState = Literal["up", "down", "unknown"]


class HealthPoller:
    """One engine's health as last probed (`url` names it in logs; `probe` answers True when it is healthy)."""

    def __init__(self, url: str, probe: Probe, config: HealthConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.probe = probe
        self.config = config
        self.clock = clock
        self.healthy: bool | None = None  # the verdict; None: not enough probes yet (counts as serving)
        self.last: bool | None = None  # the last probe's result
        self.streak = 0  # probes in a row with the last one's result
        self.passes = 0  # passing probes in all (a replica compares it to end a bench early)
        self.failures = 0  # failed probes in all
        self.error = ""  # why the last probe failed ("" after a pass)
        self.checked_at: float | None = None  # when the last probe ended

    def fresh(self, now: float | None = None) -> bool:
        """Whether the last probe ended recently enough to act on: a poller that is not running (the monitor is
        stopped or disabled) has no verdict worth keeping."""
        now = self.clock() if now is None else now
        limit = 2 * (self.config.interval_s + self.config.timeout_s)
        return self.checked_at is not None and now - self.checked_at <= limit

    def down(self) -> bool:
        """Seen down by its recent probes (unknown or stale: not down)."""
        return self.healthy is False and self.fresh()

    def state(self) -> HealthState:
        """"up", "down" or "unknown" (no verdict yet, or none recent), as /ready and /metrics show it."""
        if self.healthy is None or not self.fresh():
            return "unknown"
        return "up" if self.healthy else "down"

    async def poll(self) -> bool:
        """Probe once; True when the engine is healthy. A failure is counted and kept in `error`, never raised."""
        try:
            async with asyncio.timeout(self.config.timeout_s):
                ok = await self.probe() is True
            error = "" if ok else "the health check failed"
        except TimeoutError:
            ok, error = False, f"no answer to the health check within {self.config.timeout_s:g} s"
        except Exception as exc:  # a probe's bug must not end the polling: the engine counts as failing, and says why
            log.exception("probing %s failed", self.url)
            ok, error = False, f"{type(exc).__name__}: {exc}"[:300]
        self._record(ok, error)
        return ok

    async def run(self) -> None:
        """Probe every `interval_s` until cancelled."""
        while True:
            started = time.monotonic()
            await self.poll()
            await asyncio.sleep(max(0.0, self.config.interval_s - (time.monotonic() - started)))

    def _record(self, ok: bool, error: str) -> None:
        self.streak = self.streak + 1 if self.last is ok else 1
        self.last, self.error, self.checked_at = ok, error, self.clock()
        if ok:
            self.passes += 1
        else:
            self.failures += 1
        before = self.healthy
        if ok and self.streak >= self.config.healthy_after:
            self.healthy = True
        elif not ok and self.streak >= self.config.unhealthy_after:
            self.healthy = False
        if before is not False and self.healthy is False:
            log.warning("engine %s is down after %d failed health checks (its replicas get no requests): %s",
                        self.url, self.streak, error)
        elif before is False and self.healthy:
            log.info("engine %s passes its health checks again", self.url)


def engine_key(backend: Backend) -> str:
    """What identifies a backend's engine: its URL (credentials stripped) for an HTTP client, else its name."""
    return backend.url if isinstance(backend, OpenAIBackend) else f"{type(backend).__name__}:{backend.name}"


class HealthMonitor:
    """The engines' health pollers, one per engine however many replicas watch it, probing while started."""

    def __init__(self, config: HealthConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.pollers: dict[str, HealthPoller] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def watch(self, backend: Backend) -> HealthPoller:
        """The poller of `backend`'s engine; the first backend to watch an engine lends it its health check."""
        key = engine_key(backend)
        poller = self.pollers.get(key)
        if poller is None:
            poller = self.pollers[key] = HealthPoller(key, backend.health, self.config, self.clock)
        return poller

    async def start(self) -> None:
        """Start probing (inside the running event loop). Disabled, or nothing to probe: nothing started."""
        if self._tasks or not self.pollers or not self.config.enabled:
            return
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(p.run(), name=f"health {p.url}") for p in self.pollers.values()]

    async def aclose(self) -> None:
        """Stop probing (before the backends close: a probe would reopen a closed backend's session)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
