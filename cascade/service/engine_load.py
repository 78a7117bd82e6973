"""Each tier's engines' own load, for load-reactive routing, admission and /metrics.

The tiers' SGLang replicas are polled by cascade/branches/engine_poller.py (one poller per engine URL, whatever
the number of tiers on it); this module turns what they read into plain data per tier: the router's
`EngineView` (cascade/router/load.py) and the requests its engines queue. A tier has a view only while every one
of its replicas is an SGLang engine with a fresh reading; otherwise (an engine that is not SGLang, no metrics,
a stale reading) there is none and the gateway's own counters decide, as they do without this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cascade.branches.engine_load import Histogram
from cascade.branches.engine_poller import EngineMonitor, EnginePoller
from cascade.config import EngineLoadConfig, LoadReactiveConfig, SGLangBackendConfig
from cascade.router.load import EngineView
from cascade.tiers.build import Tier


class TierEngines:
    def __init__(self, tiers: Sequence[Tier], config: EngineLoadConfig, load: LoadReactiveConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.names = [t.name for t in tiers]
        self.quantile = load.percentile / 100
        self.min_samples = load.min_samples
        self.clock = clock
        self.monitor = EngineMonitor(config, load.window_s, clock)
        # Per tier: (replica name, poller) of each SGLang replica; `complete`: every replica is one.
        self.replicas: list[list[tuple[str, EnginePoller]]] = []
        self.complete: list[bool] = []
        for tier in tiers:
            names = [r.name for r in tier.backend.states()]
            sglang = [(name, b) for name, b in zip(names, tier.config.backends, strict=True)
                      if isinstance(b, SGLangBackendConfig)] if config.enabled else []
            self.replicas.append([(name, self.monitor.watch(b.url, b.api_key)) for name, b in sglang])
            self.complete.append(bool(sglang) and len(sglang) == len(names))
        self._ttft: dict[int, tuple[tuple[int, ...], float | None]] = {}  # per tier: poller versions -> TTFT

    async def start(self) -> None:
        await self.monitor.start()

    async def aclose(self) -> None:
        await self.monitor.aclose()

    def view(self, tier: int) -> EngineView | None:
        """The tier's engines as they report themselves, or None (not all SGLang, or a reading is not fresh)."""
        if not self.complete[tier]:
            return None
        now = self.clock()
        pollers = [p for _, p in self.replicas[tier]]
        loads = [p.load(now) for p in pollers]
        if any(load is None for load in loads):
            return None
        running = sum(load.running for load in loads if load is not None)
        queued = sum(load.queued for load in loads if load is not None)
        saturated = all(p.queued_since is not None and now - p.queued_since >= self.config.queue_for_s
                        for p in pollers)
        return EngineView(running=running, queued=queued, saturated=saturated, ttft_s=self._ttft_of(tier, pollers))

    def queued(self, tier: int) -> int | None:
        """Requests waiting on the tier's engines all together, or None (not known now)."""
        view = self.view(tier)
        return None if view is None else view.queued

    def _ttft_of(self, tier: int, pollers: list[EnginePoller]) -> float | None:
        """The engines' TTFT percentile over the window, with at least min_samples answers (cached per reading)."""
        key = tuple(p.version for p in pollers)
        cached = self._ttft.get(tier)
        if cached is not None and cached[0] == key:
            return cached[1]
        merged: Histogram | None = None
        for window in (p.ttft_window for p in pollers):
            if window is None:
                continue
            merged = window if merged is None else merged.plus(window)
            if merged is None:  # engines with different buckets: not one histogram
                break
        value = merged.quantile(self.quantile) if merged is not None and merged.count >= self.min_samples else None
        self._ttft[tier] = (key, value)
        return value


class EngineLoadCollector(Collector):
    """What the engines reported, per tier and replica, read at scrape time."""

    def __init__(self, engines: TierEngines) -> None:
        self.engines = engines

    def collect(self) -> Iterator[Metric]:
        labels = ["tier", "backend"]
        fresh = GaugeMetricFamily("cascade_engine_load_fresh", "1 while a replica's engine load (read from its "
                                  "/metrics) is recent enough to act on; 0: this gateway's own counters stand in",
                                  labels=labels)
        queued = GaugeMetricFamily("cascade_engine_queue_requests", "Requests waiting on a replica's engine "
                                   "(sglang:num_queue_reqs), whoever sent them", labels=labels)
        running = GaugeMetricFamily("cascade_engine_running_requests", "Requests running on a replica's engine "
                                    "(sglang:num_running_reqs), whoever sent them", labels=labels)
        usage = GaugeMetricFamily("cascade_engine_token_usage", "Share of a replica's engine KV pool in use "
                                  "(sglang:token_usage)", labels=labels)
        failures = CounterMetricFamily("cascade_engine_load_poll_failures", "Reads of an engine's /metrics that got "
                                       "no load (refused, timed out, not 200, not SGLang's metrics)", labels=labels)
        ttft = GaugeMetricFamily("cascade_tier_engine_ttft_seconds", "The tier's engines' own TTFT percentile over "
                                 "the load-reactive window (routing.load.percentile, window_s)", labels=["tier"])
        now = self.engines.clock()
        for index, (tier, replicas) in enumerate(zip(self.engines.names, self.engines.replicas, strict=True)):
            for name, poller in replicas:
                load = poller.load(now)
                fresh.add_metric([tier, name], float(load is not None))
                failures.add_metric([tier, name], poller.failures)
                if load is None:
                    continue
                queued.add_metric([tier, name], load.queued)
                running.add_metric([tier, name], load.running)
                if load.token_usage is not None:
                    usage.add_metric([tier, name], load.token_usage)
            view = self.engines.view(index)
            if view is not None and view.ttft_s is not None:
                ttft.add_metric([tier], view.ttft_s)
        yield from (fresh, queued, running, usage, failures, ttft)
