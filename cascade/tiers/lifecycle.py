"""The tiers' lifecycle, owned in one place: workers → supervisor → tiers → teardown.

A `TierFleet` is the running side of a config's tier ladder: its tiers as live objects (cascade/tiers/build.py)
together with the embedded workers they run on and the supervisor of those workers, started and stopped as one.
Every command that talks to tiers (`cascade serve`, `cascade label`, `cascade bench branches`) runs them as

    async with running_tiers(config, tier_names) as fleet:
        ... fleet.tiers ...

which prepares and starts only the [[workers]] the selected tiers run on, builds those tiers, and on any exit
(success, an exception, a cancellation such as Ctrl-C) closes every tier's backend and scorer and stops the
supervisor, which terminates every worker's process group. A command whose objects must exist before they
start (the gateway: its service is built from the tiers, its workers start in the app's startup hook) makes a
`TierFleet` and calls `start()` and `aclose()` itself. `cascade deploy` runs engines without tiers: its
lifecycle is the supervisor's own (`async with Supervisor(workers)`), which this one wraps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from cascade.config import CascadeConfig
from cascade.engines.supervisor import Supervisor, Worker
from cascade.tiers.build import Tier, build_tiers, make_workers


class TierFleet:
    """The config's tiers (with `tier_names`, only those) and the workers they run on, not yet started.
    `workers` replaces the ones the config would make (tests, `cascade bench`'s selection); by default
    they are `make_workers(config, log_dir, tier_names)` (log_dir default: ./logs)."""

    def __init__(self, config: CascadeConfig, tier_names: Collection[str] | None = None, *,
                 log_dir: Path | None = None, workers: Mapping[str, Worker] | None = None) -> None:
        self.config = config
        self.workers = dict(workers) if workers is not None else make_workers(
            config, log_dir or Path.cwd() / "logs", tier_names)
        self.supervisor = Supervisor(list(self.workers.values()))
        self.tiers: list[Tier] = build_tiers(config, self.workers, tier_names)
        self._closed = False

    def tier(self, name: str) -> Tier:
        return next(t for t in self.tiers if t.name == name)

    async def start(self) -> None:
        """Start the workers and wait until each is healthy (a failure stops those already started)."""
        await self.supervisor.start()

    async def aclose(self) -> None:
        """Close every tier's backend and scorer, then stop the supervisor; each step runs whatever an earlier
        one raised (the first error is re-raised after), and a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        async with AsyncExitStack() as stack:
            stack.callback(self.supervisor.stop)  # pushed first: runs last, whatever failed before it
            for tier in reversed(self.tiers):
                if tier.scorer is not None:
                    stack.push_async_callback(tier.scorer.aclose)
                stack.push_async_callback(tier.backend.aclose)

    async def __aenter__(self) -> TierFleet:
        try:
            await self.start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@asynccontextmanager
async def running_tiers(config: CascadeConfig, tier_names: Collection[str] | None = None, *,
                        log_dir: Path | None = None, workers: Mapping[str, Worker] | None = None
                        ) -> AsyncIterator[TierFleet]:
    """The tiers' fleet started (only the workers `tier_names` need), closed and stopped however the block exits."""
    fleet = TierFleet(config, tier_names, log_dir=log_dir, workers=workers)
    async with fleet:
        yield fleet
