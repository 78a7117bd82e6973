"""Polling engines' `/metrics`: one poller per engine URL, shared by everyone who reads that engine.

An `EnginePoller` reads its engine's load (cascade/branches/engine_load.py) every `poll_s` (at most
`timeout_s` per read) and keeps the last good reading, when it was read, how long the engine has been queueing,
and its TTFT histogram over the last `window_s` (the difference of two readings). A reading older than
`stale_after` polls is stale: `fresh` is False and readers fall back to their own counters, as they do for an
engine that never published (a 404 from SGLang without `--enable-metrics`, an engine that is not SGLang, an
error page). Failures are counted, never raised. `EngineMonitor` owns the pollers, their tasks and one HTTP
session; the gateway starts and closes it with its own lifecycle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

import aiohttp

from cascade.branches.engine_load import METRICS_BODY_BYTES, EngineLoad, Histogram, parse_sglang_metrics
from cascade.branches.openai_client import read_capped, split_credentials
from cascade.config import EngineLoadConfig

log = logging.getLogger("cascade.engine_load")


class EnginePoller:
    """One engine's load as last read from its `/metrics` (`url` is the server root)."""

    def __init__(self, url: str, headers: dict[str, str], config: EngineLoadConfig, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.headers = headers
        self.config = config
        self.window_s = window_s
        self.clock = clock
        self.latest: EngineLoad | None = None
        self.read_at = -float("inf")  # when `latest` was read
        self.queued_since: float | None = None  # first of the readings in a row that showed requests waiting
        self.ttft_window: Histogram | None = None  # TTFTs observed over about the last window_s
        self.polls = 0  # good readings
        self.failures = 0  # polls that got no reading
        self.error = ""  # why the last poll failed ("" after a good one)
        self.version = 0  # bumped with every good reading (readers cache what they derive from it)
        self._ttft_history: deque[tuple[float, Histogram]] = deque()

    def fresh(self, now: float | None = None) -> bool:
        """Whether the last reading is recent enough to act on (else: fall back to local counters)."""
        now = self.clock() if now is None else now
        return self.latest is not None and now - self.read_at <= self.config.stale_after * self.config.poll_s

    def load(self, now: float | None = None) -> EngineLoad | None:
        """The last reading while fresh, else None."""
        return self.latest if self.fresh(now) else None

    async def poll(self, session: aiohttp.ClientSession) -> bool:
        """Read `/metrics` once; True on a good reading. Any failure is counted and kept in `error`."""
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
            async with session.get(f"{self.url}/metrics", headers=self.headers, timeout=timeout) as response:
                status, raw = response.status, await read_capped(response, METRICS_BODY_BYTES)
            if status != 200:
                raise ValueError(f"/metrics answered {status} (SGLang serves it with --enable-metrics)")
            # Off the event loop: a large reading's parse must not hold every request this gateway serves.
            load = await asyncio.to_thread(parse_sglang_metrics, raw.decode("utf-8"))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            self._failed(f"{type(exc).__name__}: {exc}"[:300])
            return False
        self._accept(load, self.clock())
        return True

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Poll every `poll_s` until cancelled."""
        while True:
            started = time.monotonic()
            try:
                await self.poll(session)
            except Exception as exc:  # a bug here must not end the polling: the reading goes stale, and says why
                log.exception("polling %s/metrics failed", self.url)
                self._failed(f"{type(exc).__name__}: {exc}"[:300])
            await asyncio.sleep(max(0.0, self.config.poll_s - (time.monotonic() - started)))

    def _failed(self, error: str) -> None:
        if not self.error:
            log.warning("engine load from %s/metrics unavailable (this gateway's own counters stand in): %s",
                        self.url, error)
        self.failures += 1
        self.error = error

    def _accept(self, load: EngineLoad, now: float) -> None:
        if self.error:
            log.info("engine load from %s/metrics read again", self.url)
        self.latest, self.read_at, self.error = load, now, ""
        self.polls += 1
        self.version += 1
        self.queued_since = (self.queued_since or now) if load.queued > 0 else None
        self._window_ttft(load.ttft, now)

    def _window_ttft(self, ttft: Histogram | None, now: float) -> None:
        history = self._ttft_history
        if ttft is None or (history and ttft.since(history[-1][1]) is None):
            history.clear()  # not published, or the engine restarted: start the window again
        if ttft is None:
            self.ttft_window = None
            return
        history.append((now, ttft))
        while len(history) > 1 and history[1][0] <= now - self.window_s:
            history.popleft()  # keep one reading from before the window: the window is measured from it
        self.ttft_window = ttft.since(history[0][1]) if len(history) > 1 else None


class EngineMonitor:
    """The engines' pollers, one per URL however many tier replicas read it, polling while started."""

    def __init__(self, config: EngineLoadConfig, window_s: float, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.config = config
        self.window_s = window_s
        self.clock = clock
        self.pollers: dict[str, EnginePoller] = {}
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def watch(self, url: str, api_key: str = "") -> EnginePoller:
        """The poller of the engine at `url` (a server root; credentials in it become a Basic header)."""
        root, basic = split_credentials(url.rstrip("/"))
        poller = self.pollers.get(root)
        if poller is None:
            headers = {"Authorization": f"Bearer {api_key}"} if api_key else (
                {"Authorization": f"Basic {basic}"} if basic else {})
            poller = self.pollers[root] = EnginePoller(root, headers, self.config, self.window_s, self.clock)
        return poller

    async def start(self) -> None:
        """Start polling (inside the running event loop). Nothing to poll, nothing started."""
        if self._tasks or not self.pollers:
            return
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max(4, len(self.pollers))), trust_env=False)
        self._tasks = [asyncio.get_running_loop().create_task(p.run(self._session), name=f"engine-load {p.url}")
                       for p in self.pollers.values()]

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None
